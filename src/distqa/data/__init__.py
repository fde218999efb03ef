"""Training data: answer-type labels, the datasets and the resumable distributed sampler."""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.data import Dataset
    from transformers import PreTrainedTokenizerBase

    from distqa.config import Config


class AnswerType(IntEnum):
    """The five Natural Questions answer classes, in the order of the answer-type head's logits."""

    UNKNOWN = 0
    YES = 1
    NO = 2
    SHORT = 3
    LONG = 4


def build_dataset(config: Config, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """The training set named by ``config.dataset``."""
    from distqa.data.dummy import DummyDataset

    if config.dataset == "dummy":
        return DummyDataset.for_tokenizer(tokenizer, size=config.dummy_size, max_seq_len=config.max_seq_len,
                                          max_question_len=config.max_question_len, seed=config.seed)
    raise ValueError(f"unknown dataset {config.dataset!r}")
