"""The NQ feature cache of a configuration: what determines it, finding it, and building it.

No torch here: ``python -m distqa.prepare`` imports this module, and each of its featurising processes
re-imports ``prepare`` (multiprocessing's spawn), so they start light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distqa.config import ConfigError
from distqa.config.errors import DataError
from distqa.qa.feature_store import find_cache
from distqa.qa.featurize import auto_num_proc
from distqa.qa.nq.cache import CacheRequest, build_cache
from distqa.qa.nq.config import NQConfig
from distqa.qa.nq.windows import WindowSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def nq_request(config: NQConfig, tokenizer: PreTrainedTokenizerBase, source: Path | None = None,
               labelled: bool = True) -> CacheRequest:
    """What determines the NQ features of ``source`` (default: ``config.nq_train_file``); a ConfigError when the
    tokenizer's pair template does not fit the window settings (NQConfig has checked them on their own)."""
    settings = WindowSettings(config.max_seq_len, config.max_question_len, config.doc_stride,
                              config.negative_keep_rate, config.nq_seed)
    try:
        return CacheRequest.from_tokenizer(source or config.nq_train_path, tokenizer, settings, labelled,
                                           config.validation_fraction)
    except ValueError as err:
        if isinstance(err, DataError):
            raise
        raise ConfigError(f"the windows of tokenizer {config.tokenizer_source}: {err}") from None


def find_features(config: NQConfig, tokenizer: PreTrainedTokenizerBase, source: Path | None = None,
                  labelled: bool = True, hint: str = "") -> Path:
    """The directory of the NQ feature cache of ``source`` with the settings of ``config``; a
    :class:`DataError` with the command that builds it when there is none (``hint`` ends the message)."""
    request = nq_request(config, tokenizer, source, labelled)
    return find_cache(request, config.nq_cache_path, f"NQ feature cache for {request.source}",
                      "python -m distqa.prepare", hint)


def prepare_nq(config: NQConfig, tokenizer: PreTrainedTokenizerBase, source: Path | None = None,
               labelled: bool = True, **kwargs: Any) -> Path:
    """Build (or find) the NQ feature cache of ``source`` (default: ``config.nq_train_file``) with
    the settings of ``config`` (a progress bar when its ``progress_bar``); returns its directory. ``kwargs``
    override build_cache's arguments."""
    source = source or config.nq_train_path
    num_proc = config.num_proc or auto_num_proc(source.stat().st_size if source.is_file() else 0)
    options = {"num_proc": num_proc, "on_bad_line": config.on_bad_line,
               "max_bad_line_fraction": config.max_bad_line_fraction, "progress": config.progress_bar} | kwargs
    return build_cache(nq_request(config, tokenizer, source, labelled), config.nq_cache_path, **options)
