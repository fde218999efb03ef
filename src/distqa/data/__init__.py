"""Training data: answer-type labels, the datasets and the resumable distributed sampler."""

from __future__ import annotations

import logging
import os
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import Dataset
    from transformers import PreTrainedTokenizerBase

    from distqa.config import Config
    from distqa.data.cache import CacheRequest


class AnswerType(IntEnum):
    """The five Natural Questions answer classes, in the order of the answer-type head's logits."""

    UNKNOWN = 0
    YES = 1
    NO = 2
    SHORT = 3
    LONG = 4


def build_dataset(config: Config, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """The training set named by ``config.dataset``."""
    if config.dataset == "dummy":
        from distqa.data.dummy import DummyDataset

        return DummyDataset.for_tokenizer(tokenizer, size=config.dummy_size, max_seq_len=config.max_seq_len,
                                          max_question_len=config.max_question_len, seed=config.seed)
    if config.dataset == "nq":
        from distqa.data.cache import NQWindows

        directory = nq_features(config, tokenizer)
        windows = NQWindows(directory, "train")
        logging.getLogger(__name__).info("training on %d NQ windows from %s", len(windows), directory)
        return windows
    raise ValueError(f"unknown dataset {config.dataset!r}")


def nq_features(config: Config, tokenizer: PreTrainedTokenizerBase) -> Path:
    """The directory of the NQ feature cache of ``config``, which must exist."""
    from distqa.data.cache import cached

    directory = cached(nq_request(config, tokenizer), config.nq_cache_path)
    if directory is None:
        raise FileNotFoundError(f"no NQ feature cache for {config.nq_train_path} in {config.nq_cache_path}; "
                                "build it with `python -m distqa.prepare` (same settings)")
    return directory


def nq_request(config: Config, tokenizer: PreTrainedTokenizerBase, source: Path | None = None,
               labelled: bool = True) -> CacheRequest:
    """What determines the NQ features of ``source`` (default: ``config.nq_train_file``)."""
    from distqa.data.cache import CacheRequest
    from distqa.data.windows import WindowSettings

    config.check_doc_stride()
    settings = WindowSettings(config.max_seq_len, config.max_question_len, config.doc_stride,
                              config.negative_keep_rate, config.nq_seed)
    return CacheRequest.from_tokenizer(source or config.nq_train_path, tokenizer, settings, labelled,
                                       config.validation_fraction)


def prepare_nq(config: Config, tokenizer: PreTrainedTokenizerBase | None = None, source: Path | None = None,
               labelled: bool = True, **kwargs: Any) -> Path:
    """Build (or find) the NQ feature cache of ``source`` (default: ``config.nq_train_file``) with
    the settings of ``config``; returns its directory. ``kwargs`` override build_cache's arguments."""
    from distqa.data.cache import build_cache
    from distqa.pretrained import load_tokenizer

    tokenizer = tokenizer or load_tokenizer(config)
    source = source or config.nq_train_path
    num_proc = config.num_proc or auto_num_proc(source.stat().st_size if source.is_file() else 0)
    options = {"num_proc": num_proc, "on_bad_line": config.on_bad_line,
               "max_bad_line_fraction": config.max_bad_line_fraction} | kwargs
    return build_cache(nq_request(config, tokenizer, source, labelled), config.nq_cache_path, **options)


AUTO_BYTES_PER_PROCESS = 16 * 2**20
"""With ``num_proc`` 0, one featurising process per this much input, at most one per core: a process
takes about a second to start, which featurising a few MB never wins back."""


def auto_num_proc(source_bytes: int) -> int:
    return max(1, min(os.cpu_count() or 1, -(-source_bytes // AUTO_BYTES_PER_PROCESS)))


def require_nq_features(config: Config, world_size: int) -> Path:
    """The NQ feature cache of ``config``; built here only when this is the whole job.

    With several ranks it must exist before launch (``python -m distqa.prepare``): featurising
    inside the run would leave every other rank waiting in a collective until the timeout.
    """
    from distqa.data.cache import cached
    from distqa.data.nq import DataError
    from distqa.pretrained import load_tokenizer

    tokenizer = load_tokenizer(config)
    directory = cached(nq_request(config, tokenizer), config.nq_cache_path)
    if directory is not None:
        return directory
    if world_size == 1:
        return prepare_nq(config, tokenizer, progress=config.progress_bar)
    raise DataError(
        f"no NQ feature cache for {config.nq_train_path} with these settings in {config.nq_cache_path}. "
        "Build it before launching a multi-process run: `python -m distqa.prepare` with the same preset, "
        ".env and flags as this training (the launcher scripts do this for you).")
