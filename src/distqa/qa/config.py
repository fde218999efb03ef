"""The settings the question-answering tasks share: :class:`QAConfig` (windows in the tokenizer's pair format over
an :class:`~distqa.encoders.config.EncoderConfig`), the ``WINDOWS`` section, and :class:`DummyConfig` (the ``dummy``
task). NQ's and SQuAD's own are in :mod:`distqa.qa.nq.config` and :mod:`distqa.qa.squad.config`. Free of torch,
like :mod:`distqa.config`: the data modules and ``python -m distqa.prepare``'s featurising processes read them."""

from __future__ import annotations

from dataclasses import dataclass

from distqa.config import DATA, MODEL, ConfigError, Section, require_positive
from distqa.encoders.config import EncoderConfig
from distqa.encoders.template import check_window_shape

WINDOWS = Section("windows", "windows (with the tokenizer, what the NQ feature cache's fingerprint covers)")

SPECIAL_TOKENS_IN_A_PAIR = 4
"""The most special tokens a question-context pair gets from the six encoder families' templates (RoBERTa's
``<s> q </s></s> c </s>``); the featuriser checks the tokenizer's own count."""


@dataclass
class QAConfig(EncoderConfig):
    """Extractive question answering over windows in the tokenizer's pair format (``[CLS] question [SEP] document
    [SEP]`` for BERT): the built-in tasks."""

    # --- windows -----------------------------------------------------------------------------------
    max_seq_len: int = WINDOWS(
        128, "Tokens per window: the tokenizer's pair format ([CLS] question [SEP] document [SEP] for BERT, "
        "<s> question </s></s> document </s> for RoBERTa) + pad.", defines_run=True)
    max_question_len: int = WINDOWS(32, "Most question tokens kept in a window.", defines_run=True)

    # --- model -------------------------------------------------------------------------------------
    unpad: bool = MODEL(
        False, "Run the encoder on the windows' real tokens only (variable-length attention): no FLOPs on padding. "
        "Attention dropout is off, since the variable-length kernels have none. FlashAttention's varlen kernel on "
        "CUDA in bf16/fp16; elsewhere the same attention window by window. Not for DeBERTa (its attention has "
        "its own kernel).")

    # --- training data -----------------------------------------------------------------------------
    trim_padding: bool = DATA(
        True, "Pad each batch only to its longest window (rounded up to a multiple of 8), not to "
        "max_seq_len: the model skips the padding of batches of short windows. Off only for fixed shapes in "
        "training (evaluation and predict always trim).")

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("max_seq_len", "max_question_len"))
        self.check_windows()
        if self.compile_mode == "reduce-overhead" and (self.trim_padding or self.unpad):
            # CUDA graphs replay one recorded shape: every new batch length would record (and keep) new graphs.
            raise ConfigError("compile_mode=reduce-overhead records CUDA graphs for one batch shape, and "
                              f"{'unpad' if self.unpad else 'trim_padding'} gives each batch a length of its own: "
                              "set --trim-padding false --unpad false for CUDA graphs, or another compile_mode.")

    def check_windows(self) -> None:
        try:  # NQ's windows advance by doc_stride; SQuAD's check their window_overlap themselves
            check_window_shape(self.max_seq_len, self.max_question_len, getattr(self, "doc_stride", None))
        except ValueError as err:
            raise ConfigError(str(err)) from None


@dataclass
class DummyConfig(QAConfig):
    """The ``dummy`` task: the offline synthetic DummyDataset."""

    dummy_size: int = DATA(4096, "Number of examples in the DummyDataset.", defines_run=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, ("dummy_size",))
