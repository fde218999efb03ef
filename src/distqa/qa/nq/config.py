"""The ``nq`` task's settings: :class:`NQConfig` and its ``NQ_FILES`` section (the Natural Questions files and
their featurisation). Free of torch, like :mod:`distqa.config`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distqa.config import EVALUATION, ConfigError, Section, require_not_negative, require_positive, resolve_path
from distqa.qa.config import WINDOWS, QAConfig

NQ_FILES = Section("nq_files", "Natural Questions files and featurisation")


@dataclass
class NQConfig(QAConfig):
    """The ``nq`` task: Natural Questions, featurised once into a cache (``python -m distqa.prepare``)."""

    # --- windows (with the tokenizer, what the NQ feature cache's fingerprint covers) --------------
    doc_stride: int = WINDOWS(
        64, "Document wordpieces between the starts of consecutive windows of one document; at most "
        "max_seq_len - max_question_len - the tokenizer's special tokens (3; 4 for RoBERTa).", defines_run=True)
    negative_keep_rate: float = WINDOWS(
        0.1, "Fraction of training windows without an answer that are kept (0..1, deterministic by "
        "nq_seed); 1 keeps every window. Validation always keeps every window.", defines_run=True)
    validation_fraction: float = WINDOWS(
        0.1, "Fraction of NQ examples held out for validation, by example and per answer type.", defines_run=True)
    nq_seed: int = WINDOWS(
        0, "Seed of the validation split and the negative-window sampling; apart from seed, so that a "
        "new training seed reuses the cache.", defines_run=True)

    # --- Natural Questions files and featurisation -------------------------------------------------
    nq_train_file: str = NQ_FILES(
        "data/nq-sample/simplified-nq-train.jsonl", "Natural Questions train file in the Kaggle "
        "'simplified' jsonl format; the committed synthetic sample by default (data/README.md).", defines_run=True,
        must_exist="generate one with `python -m distqa.qa.nq.synthetic`, or download the real data with "
        "scripts/download_nq.sh (see data/README.md)")
    nq_cache_dir: str = NQ_FILES(
        "data/nq-cache", "Where NQ feature caches live, one subdirectory per fingerprint of input "
        "file + tokenizer + window settings (not part of it). Shared storage on multi-node runs.")
    on_bad_line: Literal["skip", "fail"] = NQ_FILES(
        "skip", "A malformed NQ line is skipped and counted (reported at the end), or fails at once. "
        "Not part of the fingerprint.")
    max_bad_line_fraction: float = NQ_FILES(
        0.01, "Refuse an NQ file with more than this fraction of malformed lines. Not part of the "
        "fingerprint.")
    num_proc: int = NQ_FILES(
        0, "Processes that featurise NQ (prepare, or a single-process train that finds no cache); "
        "0 = one per CPU core (one per 16 MB for smaller files). Not part of the fingerprint.")

    # --- evaluation and decoding -------------------------------------------------------------------
    max_answer_len: int = EVALUATION(30, "Longest answer span the decoder considers, in wordpieces.")
    long_threshold: float | None = EVALUATION(
        None, "Give a long answer when its score (best span minus the [CLS] null score) exceeds this; "
        "none = tuned for micro-F1 on the validation split at every evaluation (stored in checkpoints).")
    short_threshold: float | None = EVALUATION(
        None, "The same for the short answer (span, YES or NO); none = tuned like long_threshold.")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("max_answer_len",))
        require_not_negative(self, ("num_proc", "nq_seed"))
        for name in ("negative_keep_rate", "max_bad_line_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be between 0 and 1, got {getattr(self, name)}.")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}.")

    @property
    def nq_train_path(self) -> Path:
        return resolve_path(self.nq_train_file)

    @property
    def nq_cache_path(self) -> Path:
        return resolve_path(self.nq_cache_dir)
