"""The settings of the built-in tasks, in a chain a fork can extend from anywhere: :class:`EncoderConfig` (a
``transformers`` encoder), :class:`QAConfig` (its question-answering windows), :class:`DummyConfig` (the
``dummy`` task), :class:`NQConfig` (the ``nq`` task) and :class:`SquadConfig` (the ``squad`` task). Free of
torch, like :mod:`distqa.config`: the data modules and ``python -m distqa.prepare``'s featurising processes
read them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distqa.config import (
    DATA,
    ENCODER,
    EVALUATION,
    MODEL,
    NQ_FILES,
    REPO_ROOT,
    SQUAD_FILES,
    TINY_MODEL_DIR,
    WINDOWS,
    Config,
    ConfigError,
    require_not_negative,
    require_positive,
    resolve_path,
)
from distqa.encoders.template import check_window_shape


@dataclass
class EncoderConfig(Config):
    """A run whose model is a ``transformers`` encoder, from a local directory or the hub."""

    # --- encoder and tokenizer ---------------------------------------------------------------------
    model_name_or_path: str = ENCODER(
        str(TINY_MODEL_DIR.relative_to(REPO_ROOT)),
        "transformers encoder: a local directory or a hub name such as bert-base-uncased "
        "(hub names need network on first use). Relative paths are relative to the repository.", defines_run=True)
    tokenizer_name_or_path: str = ENCODER(
        "", "Tokenizer directory or hub name; empty means the same as model_name_or_path.")

    # --- model -------------------------------------------------------------------------------------
    from_scratch: Literal["auto", True, False] = MODEL(
        "auto", "Random encoder weights instead of the pretrained ones. auto: pretrained weights where "
        "model_name_or_path has them, random ones where it has none (a directory of a config alone, such as the "
        "offline data/tiny-bert); true: random even where there are pretrained weights; false: pretrained weights "
        "or a configuration error. The log says which. A preset's true applies to the preset's own model only.")
    dropout: float | None = MODEL(
        None, "Override the encoder's hidden and attention dropout (0 <= p < 1); none keeps the "
        "model's own.")
    attn_implementation: Literal["sdpa", "eager"] = MODEL(
        "sdpa", "The encoder's attention kernel: 'sdpa' is torch's scaled_dot_product_attention (FlashAttention "
        "or cuDNN kernels on GPUs, no seq × seq matrix in memory); 'eager' the reference matmul-softmax-matmul.")
    activation_checkpointing: bool = MODEL(
        False, "Keep only each encoder layer's input in the forward and recompute the layer in the backward "
        "(non-reentrant torch.utils.checkpoint, through the encoder's gradient_checkpointing_enable): far less "
        "activation memory for about a third more compute, for large encoders at long sequences. Same results.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1) or none, got {self.dropout}.")

    @property
    def model_source(self) -> str:
        """What to hand to ``from_pretrained``: a resolved local directory or a hub name."""
        return _local_or_hub(self.model_name_or_path)

    @property
    def tokenizer_source(self) -> str:
        return _local_or_hub(self.tokenizer_name_or_path or self.model_name_or_path)


@dataclass
class QAConfig(EncoderConfig):
    """Extractive question answering over windows in the tokenizer's pair format (``[CLS] question [SEP] document
    [SEP]`` for BERT): the built-in tasks."""

    # --- windows -----------------------------------------------------------------------------------
    max_seq_len: int = WINDOWS(
        128, "Tokens per window: the tokenizer's pair format ([CLS] question [SEP] document [SEP] for BERT, "
        "<s> question </s></s> document </s> for RoBERTa) + pad.", defines_run=True)
    max_question_len: int = WINDOWS(32, "Most question tokens kept in a window.", defines_run=True)

    # --- training data -----------------------------------------------------------------------------
    trim_padding: bool = DATA(
        True, "Pad each batch only to its longest window (rounded up to a multiple of 8), not to "
        "max_seq_len: the model skips the padding of batches of short windows. Off only for fixed shapes in "
        "training (evaluation and predict always trim).")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("max_seq_len", "max_question_len"))
        self.check_windows()

    def check_windows(self) -> None:
        try:
            check_window_shape(self.max_seq_len, self.max_question_len)
        except ValueError as err:
            raise ConfigError(str(err)) from None


@dataclass
class DummyConfig(QAConfig):
    """The ``dummy`` task: the offline synthetic DummyDataset."""

    dummy_size: int = DATA(4096, "Number of examples in the DummyDataset.", defines_run=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("dummy_size",))


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

    def check_windows(self) -> None:
        try:
            check_window_shape(self.max_seq_len, self.max_question_len, self.doc_stride)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @property
    def nq_train_path(self) -> Path:
        return resolve_path(self.nq_train_file)

    @property
    def nq_cache_path(self) -> Path:
        return resolve_path(self.nq_cache_dir)


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


SPECIAL_TOKENS_IN_A_PAIR = 4
"""The most special tokens a question-context pair gets from the six encoder families' templates (RoBERTa's
``<s> q </s></s> c </s>``); the featuriser checks the tokenizer's own count."""


def _local_or_hub(name: str) -> str:
    path = resolve_path(name)
    return str(path) if path.exists() else name
