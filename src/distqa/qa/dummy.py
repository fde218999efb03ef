"""The ``dummy`` task and its DummyDataset: synthetic question/document windows with the exact shapes of the real
NQ features (no download, no validation split).

Use it to try the whole pipeline (multi-node launch, DDP, checkpoints) with no download. Each item is
a function of ``(seed, index)`` alone, so every rank, worker and restart sees the same example at the
same index without touching any global random state.

A window is the tokenizer's own pair format (:class:`~distqa.encoders.template.PairTemplate`: ``[CLS] question
[SEP] document [SEP] [PAD]…`` for BERT, with token types 0 for the question part and 1 for the document
part; ``<s> question </s></s> document </s>`` for RoBERTa), and its words are drawn from the ids that are
no special token, wherever the vocabulary puts those. About a third of the documents are shorter than the
window (padding).
The labels are learnable, so the loss visibly falls:

* the first question token is a marker that names the answer type;
* for answerable windows, the last question tokens reappear in the document right before the answer
  span (the "clue" a reader model learns to look for); unknown windows point start and end at the first
  token ([CLS], <s>).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from distqa.distributed.runtime import Runtime
from distqa.encoders.template import PairTemplate
from distqa.qa.answers import AnswerType
from distqa.qa.config import DummyConfig
from distqa.qa.task import QATask, qa_commands
from distqa.tasks.base import Evaluator

log = logging.getLogger(__name__)

# Roughly the NQ mix per window: most windows hold no answer.
ANSWER_TYPE_WEIGHTS = {AnswerType.UNKNOWN: 0.45, AnswerType.YES: 0.05, AnswerType.NO: 0.05,
                       AnswerType.SHORT: 0.30, AnswerType.LONG: 0.15}
CLUE_LENGTH = 2
SHORT_SPAN_MAX = 5
LONG_SPAN = (8, 40)


class DummyDataset(Dataset):
    def __init__(self, size: int, max_seq_len: int, max_question_len: int, template: PairTemplate,
                 word_ids: np.ndarray, pad_id: int, seed: int = 0) -> None:
        """``template``: the tokenizer's pair format; ``word_ids``: the ids drawn as words (no special token)."""
        template.check_shape(max_seq_len, max_question_len)
        if len(word_ids) <= 2 * len(AnswerType):
            raise ValueError(f"DummyDataset needs more than {2 * len(AnswerType)} ids that are no special token, "
                             f"got {len(word_ids)}")
        self.size, self.max_seq_len, self.max_question_len = size, max_seq_len, max_question_len
        self.template, self.pad_id = template, pad_id
        self.seed = seed
        # The answer-type markers take the first word ids; the remaining ids are ordinary words.
        self.markers = np.asarray(word_ids[:len(AnswerType)], dtype=np.int64)
        self.words = np.asarray(word_ids[len(AnswerType):], dtype=np.int64)
        self.types = np.array(list(ANSWER_TYPE_WEIGHTS))
        self.type_p = np.array(list(ANSWER_TYPE_WEIGHTS.values()))

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, **kwargs: int) -> DummyDataset:
        """Windows in the pair format of ``tokenizer`` (a fast one), words from its ids that are no special token."""
        word_ids = np.setdiff1d(np.arange(len(tokenizer)), tokenizer.all_special_ids)
        return cls(template=PairTemplate.of(tokenizer.backend_tokenizer), word_ids=word_ids,
                   pad_id=tokenizer.pad_token_id, **kwargs)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for DummyDataset of size {self.size}")
        rng = np.random.default_rng([self.seed, index])
        answer_type = AnswerType(int(rng.choice(self.types, p=self.type_p)))

        question_len = int(rng.integers(CLUE_LENGTH + 2, self.max_question_len + 1))
        room = self.max_seq_len - question_len - self.template.special_count
        doc_len = room if rng.random() < 0.65 else int(rng.integers(1, room + 1))
        question = self.words[rng.integers(len(self.words), size=question_len)]
        question[0] = self.markers[answer_type]
        document = self.words[rng.integers(len(self.words), size=doc_len)]

        start = end = 0  # the first token ([CLS], <s>): no answer in this window
        doc_offset = self.template.document_offset(question_len)
        if answer_type != AnswerType.UNKNOWN and doc_len > CLUE_LENGTH:
            longest = doc_len - CLUE_LENGTH
            if answer_type == AnswerType.LONG:
                span_len = int(rng.integers(min(LONG_SPAN[0], longest), min(LONG_SPAN[1], longest) + 1))
            else:
                span_len = int(rng.integers(1, min(SHORT_SPAN_MAX, longest) + 1))
            span_start = int(rng.integers(CLUE_LENGTH, doc_len - span_len + 1))
            document[span_start - CLUE_LENGTH:span_start] = question[-CLUE_LENGTH:]
            start, end = doc_offset + span_start, doc_offset + span_start + span_len - 1
        elif answer_type != AnswerType.UNKNOWN:
            answer_type = AnswerType.UNKNOWN  # a one- or two-token document has no room for an answer

        input_ids = np.full(self.max_seq_len, self.pad_id, dtype=np.int64)
        tokens = self.template.window(question, document)
        input_ids[:len(tokens)] = tokens
        attention_mask = np.zeros(self.max_seq_len, dtype=np.int64)
        attention_mask[:len(tokens)] = 1
        token_type_ids = self.template.token_type_ids(question_len, attention_mask)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "start_positions": torch.tensor(start),
            "end_positions": torch.tensor(end),
            "answer_type": torch.tensor(int(answer_type)),
        }


class DummyTask(QATask):
    name = "dummy"
    config_class = DummyConfig
    commands = qa_commands("distqa.qa.nq.commands")  # its windows are NQ's: nq's commands read its checkpoints
    config: DummyConfig

    def train_dataset(self) -> Dataset:
        config = self.config
        self.window_template()  # a hub tokenizer is checked here, once loaded
        return DummyDataset.for_tokenizer(self.tokenizer, size=config.dummy_size, max_seq_len=config.max_seq_len,
                                          max_question_len=config.max_question_len, seed=config.seed)

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        log.info("no evaluation: the dummy dataset has no validation split")
        return None
