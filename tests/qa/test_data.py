"""DummyDataset determinism and realism (the resumable sampler's exact mid-epoch position:
tests/unit/test_sampler.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from distqa.encoders.template import PairTemplate
from distqa.qa.answers import AnswerType
from distqa.qa.dummy import DummyDataset


def make(seed: int = 0, size: int = 400, max_seq_len: int = 96) -> DummyDataset:
    return DummyDataset(size=size, max_seq_len=max_seq_len, max_question_len=24, template=PairTemplate.bert(2, 3),
                        word_ids=np.arange(5, 500), pad_id=0, seed=seed)


def test_items_depend_only_on_seed_and_index() -> None:
    a, b = make(), make()
    torch.manual_seed(1)  # global RNG state must not matter
    first = a[17]
    torch.manual_seed(2)
    _ = [b[i] for i in range(30)]  # neither must access order
    second = b[17]
    for key in first:
        assert torch.equal(first[key], second[key]), key
    other_seed = make(seed=1)[17]
    assert not torch.equal(first["input_ids"], other_seed["input_ids"])


def test_window_layout_and_labels() -> None:
    dataset = make()
    types, padded = Counter(), 0
    for i in range(len(dataset)):
        item = dataset[i]
        ids, mask, token_types = item["input_ids"], item["attention_mask"], item["token_type_ids"]
        assert ids.shape == mask.shape == token_types.shape == (96,)
        assert ids.dtype == torch.int64
        length = int(mask.sum())
        assert ids[0] == 2 and ids[length - 1] == 3  # [CLS] … [SEP]
        assert (ids[length:] == 0).all() and (mask[length:] == 0).all()
        first_doc = int(token_types.argmax())
        assert ids[first_doc - 1] == 3  # question [SEP] document
        assert (token_types[first_doc:length] == 1).all() and (token_types[length:] == 0).all()
        start, end = int(item["start_positions"]), int(item["end_positions"])
        answer_type = AnswerType(int(item["answer_type"]))
        types[answer_type] += 1
        padded += length < 96
        if answer_type == AnswerType.UNKNOWN:
            assert start == end == 0
        else:  # the span lies inside the document part
            assert first_doc <= start <= end < length - 1
            if answer_type == AnswerType.LONG:
                assert end - start + 1 >= 2
    assert set(types) == set(AnswerType), types
    assert types[AnswerType.UNKNOWN] > types[AnswerType.YES]
    assert 0.1 < padded / len(dataset) < 0.6


def test_index_out_of_range_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        make(size=3)[3]
