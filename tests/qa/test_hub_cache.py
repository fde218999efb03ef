"""A model in the hub cache under ``HF_HOME``, on a machine without the hub
(src/distqa/encoders/hub.py, pretrained.fetch_once).

The cache is built in the layout huggingface_hub writes and reads, derived from its source (huggingface_hub 2.4):
``file_download.repo_folder_name`` names the repository folder (``models--ORG--NAME``) under ``constants.HF_HUB_CACHE``
(``HF_HOME/hub``); ``_hf_hub_download_to_cache_dir`` stores each file as ``blobs/<etag>`` (the sha256 of an LFS file
such as model.safetensors, the git blob hash of any other, ``utils.sha.git_hash``) and links
``snapshots/<commit>/<file>`` to it with a relative symlink (``_create_symlink``); ``_cache_commit_hash_for_specific
_revision`` writes the commit into ``refs/main``. ``try_to_load_from_cache`` and ``scan_cache_dir`` read it back, and
``.no_exist/<commit>/<file>`` records a file the hub said is absent (``_CACHED_NO_EXIST``).

No network: HF_ENDPOINT is a closed loopback port, so any request for the hub fails at once, locally.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants, scan_cache_dir, try_to_load_from_cache
from huggingface_hub.file_download import _CACHED_NO_EXIST, repo_folder_name
from huggingface_hub.utils.sha import git_hash
from safetensors.torch import load_file

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.encoders.hub import cached_snapshot
from distqa.encoders.tiny import build_family_dir

from support.processes import clean_env, free_port
from support.qa import QA_ARGS
from support.repo import REPO_ROOT

NAME = "fake-org/tiny-roberta"
"""A hub name of no real repository: only the cache built here holds it."""
COMMIT = hashlib.sha1(b"tiny-roberta").hexdigest()
LFS_SUFFIXES = (".safetensors", ".bin", ".model")
"""What the hub stores in LFS (its blobs are named by sha256, the others by git blob hash)."""


def put_in_hub_cache(source: Path, cache: Path, name: str, commit: str) -> Path:
    """``source``'s files as ``hf download NAME`` leaves them in ``cache`` (HF_HOME/hub); the repository folder."""
    repo = cache / repo_folder_name(repo_id=name, repo_type="model")
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        etag = hashlib.sha256(data).hexdigest() if file.suffix in LFS_SUFFIXES else git_hash(data)
        blob = repo / "blobs" / etag
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = repo / "snapshots" / commit / file.name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo


@pytest.fixture(scope="module")
def hub_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(HF_HOME holding NAME in its hub cache, the model's own directory): a tiny RoBERTa built from a config, with
    random weights saved beside it, so loading the pretrained weights is a check that they came from the cache."""
    from transformers import AutoConfig, AutoModel

    source = build_family_dir("roberta", REPO_ROOT / "data" / "tokenizer-corpus.txt", tmp_path_factory.mktemp("src"))
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(source)).save_pretrained(source)
    home = tmp_path_factory.mktemp("hf-home")
    put_in_hub_cache(source, home / "hub", NAME, COMMIT)
    return home, source


def no_hub(home: Path, offline: str) -> dict[str, str]:
    """The environment of a machine without the hub: HF_HOME, HF_HUB_OFFLINE as given, the hub a closed port."""
    env = clean_env(OMP_NUM_THREADS="1", HF_HOME=str(home), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    env["HF_HUB_OFFLINE"] = offline  # clean_env sets it to 1
    return env


def test_the_cache_built_here_is_what_huggingface_hub_reads(hub_model: tuple[Path, Path]) -> None:
    home, source = hub_model
    info = scan_cache_dir(home / "hub")
    assert not info.warnings, info.warnings
    [repo] = info.repos
    [revision] = repo.revisions
    assert (repo.repo_id, repo.repo_type, revision.commit_hash, set(revision.refs)) == (NAME, "model", COMMIT, {"main"})
    assert {file.file_name for file in revision.files} == {file.name for file in source.iterdir()}
    found = try_to_load_from_cache(NAME, "model.safetensors", cache_dir=home / "hub")
    assert isinstance(found, str) and Path(found).read_bytes() == (source / "model.safetensors").read_bytes()


@pytest.mark.parametrize("offline", ["1", "0"])
def test_a_cached_hub_model_trains_without_the_hub_and_downloads_nothing(hub_model: tuple[Path, Path],
                                                                         offline: str, tmp_path: Path) -> None:
    """HF_HUB_OFFLINE=1: the name is accepted (it is cached) and read from the cache; without it, the hub cannot be
    reached and the cache serves it, logged as nothing downloaded. Either way the run trains from its weights."""
    home, _ = hub_model
    result = subprocess.run(
        [sys.executable, "-m", "distqa.train", *QA_ARGS, "--model-name-or-path", NAME, "--max-steps", "1",
         "--output-dir", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=no_hub(home, offline), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    said = {"1": f"model_name_or_path: reading {NAME} from the hub cache {home / 'hub'} (HF_HUB_OFFLINE)",
            "0": f"model_name_or_path: {NAME} is in the hub cache {home / 'hub'} already; nothing downloaded"}[offline]
    assert said in result.stderr
    assert f"loaded pretrained weights from {NAME}" in result.stderr
    assert "downloaded" not in result.stderr.replace("nothing downloaded", ""), result.stderr
    assert "Retrying" not in result.stderr, "the hub was asked again"


LOAD_SCRIPT = """
import os, sys
from safetensors.torch import save_file
from distqa.encoders.pretrained import fetch_once, load_encoder, load_encoder_config, load_tokenizer
from distqa.config.sources import load_config

config = load_config(sys.argv[2:], dotenv_path=os.devnull)
fetch_once(config, 0, lambda value: value)
encoder = load_encoder(config, load_encoder_config(config))
save_file({name: tensor.contiguous() for name, tensor in encoder.state_dict().items()}, sys.argv[1])
print(len(load_tokenizer(config)))
"""


def test_the_encoder_loaded_offline_from_the_cache_holds_its_weights(hub_model: tuple[Path, Path],
                                                                    tmp_path: Path) -> None:
    """distqa's own loaders (as a training rank calls them) give the cached model's weights and tokenizer."""
    from transformers import AutoTokenizer

    home, source = hub_model
    result = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(tmp_path / "loaded.safetensors"), "--preset",
                             "none", "--model-name-or-path", NAME],
                            cwd=REPO_ROOT, env=no_hub(home, "1"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    loaded, saved = load_file(tmp_path / "loaded.safetensors"), load_file(source / "model.safetensors")
    assert loaded.keys() >= {name for name in saved if "position_ids" not in name}
    assert all(torch.equal(loaded[name], tensor) for name, tensor in saved.items() if name in loaded)
    assert int(result.stdout.splitlines()[-1]) == len(AutoTokenizer.from_pretrained(source))


@pytest.mark.distributed
@pytest.mark.parametrize("offline", ["1", "0"])
def test_an_uncached_hub_name_without_the_hub_is_one_line_on_each_rank(offline: str, tmp_path: Path) -> None:
    """2 ranks, a hub name in no cache and no hub: each rank ends with the same one line (the name, HF_HOME and how
    to fetch it) and exit 2; nothing is retried. Offline it is refused before any process group; without
    HF_HUB_OFFLINE rank 0 tries the hub once and tells the other rank. torchrun stops the workers left once one has
    exited 2, so on a loaded machine a rank still starting can end by its SIGTERM instead, before its line."""
    home = tmp_path / "hf-home"
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "distqa.train",
         *QA_ARGS, "--model-name-or-path", "fake-org/not-cached", "--output-dir", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=no_hub(home, offline), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("distqa.train: ")]
    # torchrun's failure report: each rank with its exit code (-15: stopped by the agent after another's exit 2).
    exit_codes = dict(re.findall(r"rank +: (\d+) \(local_rank: \d+\)\n +exitcode +: (-?\d+)", result.stderr))
    assert exit_codes.keys() == {"0", "1"} and set(exit_codes.values()) <= {"2", "-15"}, result.stderr
    assert 1 <= list(exit_codes.values()).count("2") <= len(errors) <= 2 and len(set(errors)) == 1, result.stderr
    assert errors[0].startswith("distqa.train: configuration error: model_name_or_path='fake-org/not-cached' is not "
                                f"a local directory and not in the hub cache {home / 'hub'} (HF_HOME={home})")
    assert "`hf download fake-org/not-cached`" in errors[0]
    why = "HF_HUB_OFFLINE is set" if offline == "1" else "failed (ConnectError: [Errno 111] Connection refused)"
    assert why in errors[0]
    assert "exitcode  : 2" in result.stderr
    assert "Retrying" not in result.stderr and "downloading it here" not in result.stderr


# --- what counts as cached ----------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty hub cache as this process's (huggingface_hub read HF_HOME when the test session imported it)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path))
    return tmp_path / "hub"


def test_a_partial_or_absent_snapshot_is_not_cached(hub_model: tuple[Path, Path], cache: Path) -> None:
    _, source = hub_model
    assert cached_snapshot(NAME) is None
    repo = put_in_hub_cache(source, cache, NAME, COMMIT)
    assert cached_snapshot(NAME) == repo / "snapshots" / COMMIT
    (repo / "refs" / "main").write_text("f" * 40)  # main moved to a commit whose files were never fetched
    assert cached_snapshot(NAME) is None
    (repo / "refs" / "main").write_text(COMMIT)
    for marker in ("config.json", "tokenizer_config.json"):  # the hub said these are absent at that commit
        (repo / "snapshots" / COMMIT / marker).unlink()
        (repo / ".no_exist" / COMMIT).mkdir(parents=True, exist_ok=True)
        (repo / ".no_exist" / COMMIT / marker).touch()
    assert try_to_load_from_cache(NAME, "config.json", cache_dir=cache) is _CACHED_NO_EXIST
    assert cached_snapshot(NAME) is None


def test_offline_a_hub_name_is_checked_against_the_cache(hub_model: tuple[Path, Path], cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _, source = hub_model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["--preset", "none", "--model-name-or-path", NAME]
    with pytest.raises(ConfigError) as refused:
        load_config(argv, environ={}, dotenv_path=os.devnull)
    assert str(refused.value) == (
        f"model_name_or_path={NAME!r} is not a local directory and not in the hub cache {cache} (HF_HOME="
        f"{cache.parent}), and HF_HUB_OFFLINE is set, so nothing is downloaded. Fetch it on a machine with network "
        f"with `hf download {NAME}` into the same HF_HOME (or copy its models--fake-org--tiny-roberta folder into "
        f"{cache}), or give a local directory.")
    put_in_hub_cache(source, cache, NAME, COMMIT)
    assert load_config(argv, environ={}, dotenv_path=os.devnull).model_source == NAME


@pytest.mark.distributed
def test_an_uncached_hub_name_on_two_emulated_nodes_is_one_line_per_node(tmp_path: Path) -> None:
    """The README's local launcher, 2 nodes, no HF_HUB_OFFLINE and no hub: each node shows the one line, and the
    launcher ends with the workers' exit 2, without torchrun's ChildFailedError traceback or retries."""
    home = tmp_path / "hf-home"
    env = no_hub(home, "0")
    result = subprocess.run(
        ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()), "--",
         *QA_ARGS, "--model-name-or-path", "fake-org/not-cached", "--output-dir", str(tmp_path / "results")],
        cwd=REPO_ROOT, env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    errors = sorted(line for line in output.splitlines() if "distqa.train: configuration error" in line)
    assert [line.split(" distqa.train: ")[0] for line in errors] == ["[node 0]", "[node 1]"], output
    assert all(f"model_name_or_path='fake-org/not-cached' is not a local directory and not in the hub cache "
               f"{home / 'hub'} (HF_HOME={home})" in line and "`hf download fake-org/not-cached`" in line
               for line in errors)
    assert "ChildFailedError" not in output and "Retrying" not in output
