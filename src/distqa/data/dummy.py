"""DummyDataset: synthetic question/document windows with the exact shapes of the real NQ features.

Use it to try the whole pipeline (multi-node launch, DDP, checkpoints) with no download. Each item is
a function of ``(seed, index)`` alone, so every rank, worker and restart sees the same example at the
same index without touching any global random state.

A window is ``[CLS] question [SEP] document [SEP] [PAD]…`` with token types 0 for the question part
and 1 for the document part. About a third of the documents are shorter than the window (padding).
The labels are learnable, so the loss visibly falls:

* the first question token is a marker that names the answer type;
* for answerable windows, the last question tokens reappear in the document right before the answer
  span (the "clue" a reader model learns to look for); unknown windows point start and end at [CLS].
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from distqa.answers import AnswerType
from distqa.data.windows import check_window_shape

# Roughly the NQ mix per window: most windows hold no answer.
ANSWER_TYPE_WEIGHTS = {AnswerType.UNKNOWN: 0.45, AnswerType.YES: 0.05, AnswerType.NO: 0.05,
                       AnswerType.SHORT: 0.30, AnswerType.LONG: 0.15}
CLUE_LENGTH = 2
SHORT_SPAN_MAX = 5
LONG_SPAN = (8, 40)


class DummyDataset(Dataset):
    def __init__(self, size: int, max_seq_len: int, max_question_len: int, vocab_size: int,
                 cls_id: int, sep_id: int, pad_id: int, first_word_id: int, seed: int = 0) -> None:
        """``first_word_id``: ids below it are special tokens and never drawn as words."""
        check_window_shape(max_seq_len, max_question_len)
        if vocab_size - first_word_id <= len(AnswerType):
            raise ValueError(f"vocab_size {vocab_size} is too small for DummyDataset")
        self.size, self.max_seq_len, self.max_question_len = size, max_seq_len, max_question_len
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
        self.seed = seed
        # The answer-type markers take the first word ids; the remaining ids are ordinary words.
        self.markers = np.arange(first_word_id, first_word_id + len(AnswerType))
        self.word_ids = (first_word_id + len(AnswerType), vocab_size)
        self.types = np.array(list(ANSWER_TYPE_WEIGHTS))
        self.type_p = np.array(list(ANSWER_TYPE_WEIGHTS.values()))

    @classmethod
    def for_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, **kwargs: int) -> DummyDataset:
        first_word_id = max(tokenizer.all_special_ids) + 1
        return cls(vocab_size=len(tokenizer), cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
                   pad_id=tokenizer.pad_token_id, first_word_id=first_word_id, **kwargs)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for DummyDataset of size {self.size}")
        rng = np.random.default_rng([self.seed, index])
        answer_type = AnswerType(int(rng.choice(self.types, p=self.type_p)))

        question_len = int(rng.integers(CLUE_LENGTH + 2, self.max_question_len + 1))
        room = self.max_seq_len - question_len - 3
        doc_len = room if rng.random() < 0.65 else int(rng.integers(1, room + 1))
        question = rng.integers(*self.word_ids, size=question_len)
        question[0] = self.markers[answer_type]
        document = rng.integers(*self.word_ids, size=doc_len)

        start = end = 0  # [CLS]: no answer in this window
        doc_offset = question_len + 2  # [CLS] question [SEP]
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
        tokens = np.concatenate([[self.cls_id], question, [self.sep_id], document, [self.sep_id]])
        input_ids[:len(tokens)] = tokens
        attention_mask = np.zeros(self.max_seq_len, dtype=np.int64)
        attention_mask[:len(tokens)] = 1
        token_type_ids = np.zeros(self.max_seq_len, dtype=np.int64)
        token_type_ids[doc_offset:len(tokens)] = 1
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "start_positions": torch.tensor(start),
            "end_positions": torch.tensor(end),
            "answer_type": torch.tensor(int(answer_type)),
        }
