"""The ``squad`` task's settings: :class:`SquadConfig` and its ``SQUAD_FILES`` section (the files in the SQuAD
schema and their featurisation). Free of torch, like :mod:`distqa.config`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distqa.config import EVALUATION, ConfigError, Section, require_not_negative, require_positive, resolve_path
from distqa.qa.config import SPECIAL_TOKENS_IN_A_PAIR, WINDOWS, QAConfig

SQUAD_FILES = Section("squad_files", "SQuAD files and featurisation")


@dataclass
class SquadConfig(QAConfig):
    """The ``squad`` task: data in the SQuAD schema, featurised once into a cache (``python -m distqa.prepare
    --task squad``), scored by the official SQuAD v2.0 exact match and F1."""

    # --- windows (with the tokenizer, what the SQuAD feature cache's fingerprint covers) -----------
    window_overlap: int = WINDOWS(
        32, "Context tokens that consecutive windows of one context share (the tokenizer's stride; run_qa.py's "
        "--doc_stride); below max_seq_len - max_question_len - 4, the context part of a window.", defines_run=True)

    # --- SQuAD files and featurisation -------------------------------------------------------------
    squad_train_file: str = SQUAD_FILES(
        "data/squad-sample/train.json", "Training data in the SQuAD schema: a SQuAD v1.1/v2.0 .json, a .jsonl or "
        ".parquet in the Hugging Face squad schema (id, title, context, question, answers{text, answer_start}), "
        "or hf:NAME:SPLIT, a Hugging Face dataset that prepare fetches once into HF_HOME (hf:rajpurkar/squad_v2:"
        "train). The committed sample by default (docs/SQUAD.md).", defines_run=True)
    squad_validation_file: str = SQUAD_FILES(
        "data/squad-sample/dev.json", "Validation data in the same forms (a dev file); empty: validation_fraction "
        "of the training contexts is held out instead.", defines_run=True)
    validation_fraction: float = SQUAD_FILES(
        0.1, "With no squad_validation_file: the fraction of the training questions held out for validation, whole "
        "contexts at a time (no context is in both splits).", defines_run=True)
    squad_cache_dir: str = SQUAD_FILES(
        "data/squad-cache", "Where SQuAD feature caches live, one subdirectory per fingerprint of the input files "
        "+ tokenizer + window settings. Shared storage on multi-node runs.")
    on_bad_line: Literal["skip", "fail"] = SQUAD_FILES(
        "skip", "A malformed record (a question of a SQuAD .json, a line of a .jsonl, a row) is skipped and counted "
        "(reported at the end), or fails at once. Not part of the fingerprint.")
    max_bad_line_fraction: float = SQUAD_FILES(
        0.01, "Refuse a file with more than this fraction of malformed records. Not part of the fingerprint.")
    num_proc: int = SQUAD_FILES(
        0, "Processes that featurise (prepare, or a single-process train that finds no cache); 0 = one per CPU "
        "core (one per 16 MB for smaller files). Not part of the fingerprint.")

    # --- evaluation and decoding -------------------------------------------------------------------
    max_answer_len: int = EVALUATION(30, "Longest answer span the decoder considers, in wordpieces.")
    no_answer_threshold: float | None = EVALUATION(
        None, "Answer when the best span's score (start + end logit) beats the null ([CLS]) score by more than "
        "this, else give no answer (\"\"); none = tuned for F1 on the validation data at every evaluation, as the "
        "official script's best_f1_thresh (stored in checkpoints, used by predict).")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("max_answer_len",))
        require_not_negative(self, ("num_proc",))
        if not 0 <= self.max_bad_line_fraction <= 1:
            raise ConfigError(f"max_bad_line_fraction must be between 0 and 1, got {self.max_bad_line_fraction}.")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}.")
        if not self.squad_train_file:
            raise ConfigError("squad_train_file is empty; give a SQuAD-format file or hf:NAME:SPLIT.")

    def check_windows(self) -> None:
        super().check_windows()
        room = self.max_seq_len - self.max_question_len - SPECIAL_TOKENS_IN_A_PAIR
        if not 0 <= self.window_overlap < room:
            raise ConfigError(f"window_overlap ({self.window_overlap}) must be at least 0 and below max_seq_len - "
                              f"max_question_len - {SPECIAL_TOKENS_IN_A_PAIR} = {room}, the context part of a "
                              "window; otherwise windows would not advance through the context.")

    @property
    def squad_cache_path(self) -> Path:
        return resolve_path(self.squad_cache_dir)
