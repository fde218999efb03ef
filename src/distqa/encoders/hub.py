"""Hub names and the hub cache under ``HF_HOME``, read the way ``huggingface_hub`` reads it (no torch, no transformers).

A model that a machine without the hub is to load lies in the hub cache (``HF_HOME/hub``, or ``HF_HUB_CACHE``) in
huggingface_hub's layout: ``models--ORG--NAME/refs/main`` names a commit, ``snapshots/<commit>/`` holds the files
(links into ``blobs/``). ``hf download NAME`` on a machine with network writes exactly that; so does a copy of the
folder. A name that passes :func:`cached_snapshot` is one that ``from_pretrained(NAME)`` then loads with
``HF_HUB_OFFLINE=1``; one that does not is the one line of :func:`not_available`. :func:`hub_unreachable` tells in
one request that the hub cannot be asked at all (a dataset's loader would retry for half a minute).
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import HfApi, constants, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.file_download import repo_folder_name

MARKER_FILES = ("config.json", "tokenizer_config.json")
"""A cached snapshot of a model holds one of these (a tokenizer-only repository has no config.json)."""


def hub_offline() -> bool:
    """Whether downloads are off: ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) set to a true value,
    as ``huggingface_hub.constants`` reads them (``_is_true``); read now, not at import, so a caller sees the
    environment it runs in."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in constants.ENV_VARS_TRUE_VALUES


def hub_cache() -> Path:
    """The hub cache every loader of this process reads: ``huggingface_hub.constants.HF_HUB_CACHE`` (``HF_HUB_CACHE``,
    else ``HF_HOME/hub``, as the environment was when huggingface_hub was imported)."""
    return Path(constants.HF_HUB_CACHE)


def hf_home() -> str:
    return constants.HF_HOME


def cached_snapshot(name: str) -> Path | None:
    """The snapshot folder ``refs/main`` of ``name`` points to in the hub cache, if it holds a model's config or
    tokenizer config; None otherwise (not cached, a partial copy, or a name huggingface_hub would refuse)."""
    for filename in MARKER_FILES:
        try:
            found = try_to_load_from_cache(name, filename, cache_dir=hub_cache())
        except ValueError:  # not a repository id huggingface_hub accepts: not cached either
            return None
        if isinstance(found, str):  # not None, and not _CACHED_NO_EXIST (a file the hub said is absent)
            return Path(found).parent
    return None


def cached_files(name: str) -> set[Path]:
    """Every file of every snapshot of ``name`` in the hub cache: compared before and after a fetch, it says
    whether the fetch downloaded anything."""
    snapshots = hub_cache() / repo_folder_name(repo_id=name, repo_type="model") / "snapshots"
    return {path for path in snapshots.rglob("*") if not path.is_dir()} if snapshots.is_dir() else set()


def not_available(setting: str, name: str, reason: str) -> str:
    """One line: ``name`` (the value of ``setting``) is neither local nor in the hub cache, why it was not fetched,
    and how to put it there."""
    return (f"{setting}={name!r} is not a local directory and not in the hub cache {hub_cache()} "
            f"(HF_HOME={hf_home()}), and {reason}. Fetch it on a machine with network with `hf download {name}` "
            f"into the same HF_HOME (or copy its {repo_folder_name(repo_id=name, repo_type='model')} folder into "
            f"{hub_cache()}), or give a local directory.")


def hub_unreachable(name: str, repo_type: str) -> str | None:
    """Why the hub cannot be asked about the repository ``name`` now, from one request without retries
    (``HfApi.repo_info``); None when it answered, even with an error of its own (no such repository, a gated one:
    the loader then says which)."""
    try:
        HfApi().repo_info(name, repo_type=repo_type, timeout=10)
    except (HfHubHTTPError, ValueError):  # the hub answered, or the name is no repository id: the loader reports it
        return None
    except Exception as err:  # no answer: refused, unresolvable, timed out, a proxy's error
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"the hub {constants.ENDPOINT} cannot be reached ({type(err).__name__}: {first})"
    return None
