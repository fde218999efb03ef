"""The SQuAD feature cache of a configuration: what determines it, finding it, and building it.

No torch here, as in :mod:`distqa.qa.nq.prepared` (NQ's): ``python -m distqa.prepare`` imports this module, and its
featurising processes start light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distqa.qa.feature_store import find_cache
from distqa.qa.featurize import auto_num_proc
from distqa.qa.squad.cache import SquadCacheRequest, build_squad_cache
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.reader import hub_name, source_path
from distqa.qa.squad.windows import SquadWindowSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def squad_request(config: SquadConfig, tokenizer: PreTrainedTokenizerBase, source: str | Path | None = None,
                  labelled: bool = True) -> SquadCacheRequest:
    """What determines the features of ``source`` (default: the config's training and validation files)."""
    settings = SquadWindowSettings(config.max_seq_len, config.max_question_len, config.window_overlap)
    return SquadCacheRequest.from_tokenizer(tokenizer, source or config.squad_train_file, settings,
                                            config.squad_validation_file, config.validation_fraction, labelled)


def find_squad_features(config: SquadConfig, tokenizer: PreTrainedTokenizerBase, source: str | Path | None = None,
                        labelled: bool = True, hint: str = "") -> Path:
    """The directory of the cache of ``source`` with the settings of ``config``; a :class:`DataError` with the
    command that builds it when there is none (``hint`` ends the message)."""
    request = squad_request(config, tokenizer, source, labelled)
    return find_cache(request, config.squad_cache_path, f"SQuAD feature cache for {request.train}",
                      "python -m distqa.prepare --task squad", hint)


def prepare_squad(config: SquadConfig, tokenizer: PreTrainedTokenizerBase, source: str | Path | None = None,
                  labelled: bool = True, **kwargs: Any) -> Path:
    """Build (or find) the cache of ``source`` (default: the config's files) with the settings of ``config``; returns
    its directory. ``kwargs`` override build_squad_cache's arguments."""
    request = squad_request(config, tokenizer, source, labelled)
    sources = [s for s in (request.train, request.validation) if s]
    size = sum(source_path(s, "input").stat().st_size for s in sources if not hub_name(s))
    num_proc = config.num_proc or (auto_num_proc(size) if not any(map(hub_name, sources)) else os.cpu_count() or 1)
    options = {"num_proc": num_proc, "on_bad_line": config.on_bad_line,
               "max_bad_line_fraction": config.max_bad_line_fraction} | kwargs
    return build_squad_cache(request, config.squad_cache_path, **options)
