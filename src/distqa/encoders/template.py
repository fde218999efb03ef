"""Where a tokenizer puts its special tokens around a (question, document) pair: the window template, each encoder
family's own, written in its fast tokenizer's post-processor (the families': docs/CONFIGURATION.md, "Another encoder").

:meth:`PairTemplate.of` reads it from the tokenizer itself: it encodes a probe pair with the special tokens
and splits the result by the sequence ids (None for a special token, 0 for the question, 1 for the
document), so the windows built from it are what ``tokenizer(question, document)`` gives, token types
included. The first token is the null answer of every window ("no answer here", start = end = 0), so
the template must begin with a special token; every family does.

Free of torch and transformers: the featurising processes build windows with it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

PROBES = (("a b", "c d e"), ("what", "x"))
"""Question and document texts the template is read from; two pairs of other lengths must give the same
special tokens (a post-processor whose tokens depended on the text could not be written into a cache)."""


@dataclass(frozen=True)
class PairTemplate:
    """``prefix question middle document suffix``: the special token ids of each part, and the token type
    (segment id) of the question's side (prefix, question, middle) and of the document's (document, suffix)."""

    prefix: tuple[int, ...]
    """Special tokens before the question (``[CLS]``, ``<s>``): position 0 is the null answer."""
    middle: tuple[int, ...]
    """Between the question and the document (``[SEP]``, ``</s></s>``)."""
    suffix: tuple[int, ...]
    """After the document (``[SEP]``, ``</s>``)."""
    question_type: int = 0
    document_type: int = 1

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("the tokenizer puts no special token before the question of a pair; windows need "
                             "one first ([CLS] or <s>) for the null answer")

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PairTemplate:
        """The template of a ``tokenizers.Tokenizer`` (a transformers fast tokenizer's ``backend_tokenizer``);
        ValueError, saying what is wrong, when its pair encoding is not ``specials question specials document
        specials`` or does not start with a special token."""
        tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: no padding, no truncation
        tokenizer.no_padding()
        tokenizer.no_truncation()
        templates = {_split(tokenizer.encode(question, document, add_special_tokens=True))
                     for question, document in PROBES}
        if len(templates) != 1:
            raise ValueError("the tokenizer's special tokens around a pair depend on the text; windows need a "
                             "fixed template")
        return templates.pop()

    @property
    def special_count(self) -> int:
        """Special tokens in every window (``num_special_tokens_to_add(pair=True)``)."""
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def document_offset(self, question_len: int | np.ndarray) -> Any:
        """Window position of the first document token, after ``question_len`` question tokens."""
        return len(self.prefix) + question_len + len(self.middle)

    def check_shape(self, max_seq_len: int, max_question_len: int, doc_stride: int | None = None) -> None:
        """ValueError naming the setting when a window of this template leaves no room for the document, or
        ``doc_stride`` would leave document tokens out of every window."""
        check_window_shape(max_seq_len, max_question_len, doc_stride, self.special_count)

    def token_type_ids(self, question_len: int, attention_mask: np.ndarray) -> np.ndarray:
        """The token types of a window with ``question_len`` question tokens whose ``attention_mask`` is 1 on its
        tokens and 0 on its padding (type 0 there)."""
        document_side = _positions(len(attention_mask)) >= self.document_offset(question_len)
        if (self.question_type, self.document_type) == (0, 1):  # BERT's, read for every item: the fast way
            return attention_mask * document_side
        return attention_mask * np.where(document_side, self.document_type, self.question_type)

    def window(self, question: np.ndarray, document: np.ndarray) -> np.ndarray:
        """The ids of one window, unpadded: what the tokenizer's post-processor makes of the pair."""
        return np.concatenate([self.prefix, question, self.middle, document, self.suffix]).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and ints, for a cache manifest (:meth:`from_dict` reads it back)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PairTemplate:
        return cls(**{name: tuple(value) if isinstance(value, list) else value for name, value in values.items()})

    @classmethod
    def bert(cls, cls_id: int, sep_id: int) -> PairTemplate:
        """``[CLS] question [SEP] document [SEP]``, types 0 up to the first [SEP] and 1 after: the only layout the
        feature caches had before the template was read from the tokenizer (and so not stored with them)."""
        return cls((cls_id,), (sep_id,), (sep_id,), question_type=0, document_type=1)


@functools.cache
def _positions(length: int) -> np.ndarray:
    return np.arange(length)


def _split(encoding: Encoding) -> PairTemplate:
    ids, types, sequences = encoding.ids, encoding.type_ids, encoding.sequence_ids
    question = [i for i, sequence in enumerate(sequences) if sequence == 0]
    document = [i for i, sequence in enumerate(sequences) if sequence == 1]
    if not question or not document or question[-1] > document[0] \
            or len(question) != question[-1] - question[0] + 1 or len(document) != document[-1] - document[0] + 1:
        raise ValueError(f"the tokenizer's pair encoding is not specials, question, specials, document, specials "
                         f"(sequence ids {sequences})")
    parts = slice(0, question[0]), slice(question[-1] + 1, document[0]), slice(document[-1] + 1, len(ids))
    question_side = [*types[parts[0]], *types[parts[1]], *(types[i] for i in question)]
    document_side = [*types[parts[2]], *(types[i] for i in document)]
    if len(set(question_side)) != 1 or len(set(document_side)) != 1:
        raise ValueError(f"the tokenizer's token types are not one for the question's side and one for the "
                         f"document's ({types})")
    prefix, middle, suffix = (tuple(ids[part]) for part in parts)
    return PairTemplate(prefix, middle, suffix, question_side[0], document_side[0])


def check_window_shape(max_seq_len: int, max_question_len: int, doc_stride: int | None = None,
                       special_tokens: int = 3) -> None:
    """The rule of a window's shape, for every user of it: ``special_tokens`` (3 for ``[CLS] question [SEP]
    document [SEP]``, 4 for RoBERTa's pair) and the question leave room for at least one document token, and
    windows ``doc_stride`` pieces apart leave no piece of the document out. A ValueError naming the setting
    and the bound otherwise."""
    if max_question_len + special_tokens + 1 > max_seq_len:
        raise ValueError(f"max_question_len ({max_question_len}) leaves no room for the document in max_seq_len "
                         f"({max_seq_len}) with {special_tokens} special tokens; use max_question_len <= max_seq_len "
                         f"- {special_tokens + 1}.")
    room = max_seq_len - max_question_len - special_tokens
    if doc_stride is not None and not 1 <= doc_stride <= room:
        raise ValueError(f"doc_stride ({doc_stride}) must be between 1 and the document part of a window, "
                         f"max_seq_len - max_question_len - {special_tokens} (special tokens) = {room}; otherwise "
                         "some text is in no window.")
