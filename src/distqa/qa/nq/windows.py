"""Tokenise each NQ document once and cut it into labelled model windows.

A window is the tokenizer's own pair format (:class:`~distqa.encoders.template.PairTemplate`: ``[CLS] question
[SEP] document piece slice [SEP]`` for BERT, ``<s> question </s></s> … </s>`` for RoBERTa) padded to
``max_seq_len`` tokens; consecutive windows start ``doc_stride`` pieces apart, so every piece is in at
least one window.

HTML tag tokens (``<P>``, ``</Td>``, …: a whole whitespace token of the form ``</?Name>``) are kept
out of the model input. They mark structure the long-answer candidates already describe, and as
text they would cost three wordpieces each and about a tenth of every window. Every wordpiece keeps
the index of the whitespace token it came from (``piece_to_token``), so a predicted window span maps
back to document tokens; a long-answer span maps back to the words inside the candidate, and
:func:`containing_candidate` recovers the candidate (tags included).

Speed. With BERT-style tokenizers (WordPiece behind a whitespace/punctuation pre-tokenizer and a
per-character normaliser: ``bert-*``, ``distilbert``, ``electra``, …) a whitespace token's pieces do
not depend on its neighbours, so each *distinct* token is tokenised once, in one ``encode_batch``
call per batch, and remembered (a bounded cache per process): on Wikipedia text most tokens are
repeats, and this is several times faster than tokenising whole documents. Other tokenizers
(byte-level BPE, SentencePiece), whose pieces carry the preceding space, tokenise whole documents
in one ``encode_batch`` call: tags are blanked with spaces of the same length, so the character
offsets still index the original text, and a piece's whitespace token is a ``searchsorted`` over
the token start offsets. Both paths give identical features where both apply (tested), and
neither runs the tokenizer once per word.

Labels: a window is positive when one target span lies wholly inside its document part: the first
such short span for SHORT examples, the long answer for LONG, YES and NO ones. Its start/end are
positions in the window and its answer type is the example's. Every other window points at the
template's first token ([CLS], <s>: position 0) with answer type UNKNOWN, and is kept with
probability ``negative_keep_rate``, drawn from a generator seeded by (seed, example_id): the same
windows survive in every run and for any number of processes.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from distqa.encoders.template import PairTemplate, check_window_shape
from distqa.qa.answers import AnswerType, Span
from distqa.qa.featurize import SplitStats
from distqa.qa.nq.reader import NQExample

TAG_TOKEN = re.compile(r"(?<![^ ])</?[A-Za-z][A-Za-z0-9]*>(?![^ ])")
"""An HTML tag that is a whole whitespace token, as in NQ's document_text."""

SPACE = ord(" ")


@dataclass(frozen=True)
class WindowSettings:
    max_seq_len: int
    max_question_len: int
    doc_stride: int
    negative_keep_rate: float
    seed: int

    def __post_init__(self) -> None:
        check_window_shape(self.max_seq_len, self.max_question_len, self.doc_stride)
        if not 0 <= self.negative_keep_rate <= 1:
            raise ValueError(f"negative_keep_rate must be in [0, 1], got {self.negative_keep_rate}")


@dataclass
class WindowStats(SplitStats):
    """Counts over a batch of examples; add them up with ``+=``."""

    examples: int = 0
    windows: int = 0
    """Windows before negatives were downsampled."""
    kept: int = 0
    positive: int = 0
    answerable: int = 0
    unreachable: int = 0
    """Answerable examples whose answer has no wordpiece (only tags) or lies in no single window."""
    by_type: dict[str, int] = field(default_factory=lambda: {t.name: 0 for t in AnswerType})


@dataclass
class Features:
    """Window columns (one row per kept window) and example columns (one row per example)."""

    windows: dict[str, np.ndarray]
    examples: dict[str, list | np.ndarray]
    stats: WindowStats


class Featurizer:
    """Turns batches of :class:`NQExample` into window and example columns.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (``PreTrainedTokenizerFast.backend_tokenizer``); the window
    template is its own (:meth:`PairTemplate.of`) unless ``template`` is given. ValueError naming the setting
    when ``settings`` leave the template's windows no room for the document.
    """

    def __init__(self, tokenizer: Tokenizer, pad_id: int, settings: WindowSettings,
                 template: PairTemplate | None = None) -> None:
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a private copy: no padding/truncation
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.template = template or PairTemplate.of(self.tokenizer)
        self.template.check_shape(settings.max_seq_len, settings.max_question_len, settings.doc_stride)
        self.pad_id = pad_id
        self.settings = settings
        vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.id_dtype = np.uint16 if vocab_size <= 2**16 else np.int32
        self.by_word = tokenizes_words_independently(self.tokenizer)
        self.word_pieces: dict[str, tuple[int, ...]] = {}

    def featurize(self, examples: Sequence[NQExample], keep_all: bool = False) -> Features:
        """All windows of every example, negatives downsampled unless ``keep_all``."""
        settings, stats = self.settings, WindowStats()
        questions = self.tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
        documents = self._pieces_by_word(examples) if self.by_word else self._pieces_by_document(examples)
        windows: dict[str, list[np.ndarray]] = {name: [] for name in WINDOW_COLUMNS}
        rows: dict[str, list] = {name: [] for name in EXAMPLE_COLUMNS}
        for index, (example, question, (piece_ids, piece_to_token)) in enumerate(
                zip(examples, questions, documents, strict=True)):
            question_ids = np.asarray(question.ids[:settings.max_question_len], dtype=self.id_dtype)
            stats += self._windows(index, example, question_ids, piece_ids, piece_to_token, keep_all, windows)
            _add_example_row(rows, example, len(question_ids), piece_to_token)
        empty = {name: np.empty(0, dtype=dtype) for name, dtype in WINDOW_COLUMNS.items() if dtype}
        empty["input_ids"] = np.empty((0, settings.max_seq_len), dtype=self.id_dtype)
        return Features({name: np.concatenate(parts) if parts else empty[name] for name, parts in windows.items()},
                        rows, stats)

    def _pieces_by_word(self, examples: Sequence[NQExample]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(piece ids, token index per piece) of each document from the per-token cache."""
        cache = self.word_pieces
        documents = [example.document.split(" ") for example in examples]
        missing = list({token for tokens in documents for token in tokens if token not in cache})
        if len(cache) + len(missing) > WORD_CACHE_SIZE:
            cache.clear()  # bounded memory; the next batches refill it with the frequent words
            missing = list({token for tokens in documents for token in tokens})
        for token, encoding in zip(missing, self.tokenizer.encode_batch(missing, add_special_tokens=False),
                                   strict=True):
            cache[token] = () if TAG_TOKEN.fullmatch(token) else tuple(encoding.ids)
        for tokens in documents:
            pieces = [cache[token] for token in tokens]
            counts = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
            piece_ids = np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int64, count=int(counts.sum()))
            yield piece_ids, np.repeat(np.arange(len(tokens), dtype=np.int32), counts)

    def _pieces_by_document(self, examples: Sequence[NQExample]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(piece ids, token index per piece) of each document, tokenised whole with tags blanked."""
        blanked = [blank_tags(example.document) for example in examples]
        encodings = self.tokenizer.encode_batch(blanked, add_special_tokens=False)
        for example, text, encoding in zip(examples, blanked, encodings, strict=True):
            yield pieces_of(example.document, text, encoding.ids, encoding.offsets)

    def _windows(self, index: int, example: NQExample, question_ids: np.ndarray, piece_ids: np.ndarray,
                 piece_to_token: np.ndarray, keep_all: bool, out: dict[str, list[np.ndarray]]) -> WindowStats:
        settings, length, template = self.settings, self.settings.max_seq_len, self.template
        num_question = len(question_ids)
        room = length - num_question - template.special_count
        doc_offset = template.document_offset(num_question)
        num_pieces = len(piece_ids)
        count = 1 if num_pieces <= room else 1 + math.ceil((num_pieces - room) / settings.doc_stride)
        starts = np.arange(count, dtype=np.int64) * settings.doc_stride

        # Labels: the first target span wholly inside each window's document part.
        answer_type = example.targets.answer_type if example.targets else AnswerType.UNKNOWN
        start_pos = np.zeros(count, dtype=np.int16)
        end_pos = np.zeros(count, dtype=np.int16)
        types = np.full(count, AnswerType.UNKNOWN, dtype=np.int8)
        labelled = np.zeros(count, dtype=bool)
        spans = example.targets.label_spans if example.targets else ()
        for span in spans:
            first, last = token_span_to_pieces(piece_to_token, span)
            if first > last:
                continue  # the span holds only tags: no piece can point at it
            inside = ~labelled & (first >= starts) & (last < starts + room)
            start_pos[inside] = (first - starts[inside] + doc_offset)
            end_pos[inside] = (last - starts[inside] + doc_offset)
            types[inside] = answer_type
            labelled |= inside

        stats = WindowStats(examples=1, windows=count, positive=int(labelled.sum()))
        stats.by_type[answer_type.name] += 1
        if spans:
            stats.answerable = 1
            stats.unreachable = int(not labelled.any())
        keep = labelled.copy()
        if keep_all or settings.negative_keep_rate >= 1:
            keep[:] = True
        elif settings.negative_keep_rate > 0:
            draws = np.random.default_rng([settings.seed, example.example_id % 2**64]).random(count)
            keep |= draws < settings.negative_keep_rate
        stats.kept = int(keep.sum())
        if not stats.kept:
            return stats

        kept_starts = starts[keep]
        input_ids = np.full((len(kept_starts), length), self.pad_id, dtype=self.id_dtype)
        input_ids[:, :doc_offset] = np.concatenate([template.prefix, question_ids, template.middle])
        doc_lengths = np.minimum(num_pieces - kept_starts, room)
        for row, (start, doc_length) in enumerate(zip(kept_starts.tolist(), doc_lengths.tolist(), strict=True)):
            end = doc_offset + doc_length
            input_ids[row, doc_offset:end] = piece_ids[start:start + doc_length]
            input_ids[row, end:end + len(template.suffix)] = template.suffix
        out["input_ids"].append(input_ids)
        out["length"].append((num_question + template.special_count + doc_lengths).astype(np.int16))
        out["question_len"].append(np.full(len(kept_starts), num_question, dtype=np.int16))
        out["example_index"].append(np.full(len(kept_starts), index, dtype=np.int32))
        out["doc_start"].append(kept_starts.astype(np.int32))
        out["start_position"].append(start_pos[keep])
        out["end_position"].append(end_pos[keep])
        out["answer_type"].append(types[keep])
        return stats


# Window column -> dtype (input_ids: the featurizer's id dtype, one row of max_seq_len per window).
WINDOW_COLUMNS: dict[str, type | None] = {
    "input_ids": None, "length": np.int16, "question_len": np.int16, "example_index": np.int32,
    "doc_start": np.int32, "start_position": np.int16, "end_position": np.int16, "answer_type": np.int8,
}
EXAMPLE_COLUMNS = ("example_id", "question", "answer_type", "num_tokens", "question_len", "piece_to_token",
                   "candidate_start", "candidate_end", "candidate_top_level", "long_start", "long_end",
                   "long_candidate", "short_start", "short_end")


def _add_example_row(rows: dict[str, list], example: NQExample, question_len: int,
                     piece_to_token: np.ndarray) -> None:
    targets = example.targets
    long = targets.long if targets and targets.long else Span(-1, -1)
    short = targets.short if targets else ()
    values = {
        "example_id": example.example_id, "question": example.question,
        "answer_type": int(targets.answer_type) if targets else -1,
        "num_tokens": example.num_tokens, "question_len": question_len, "piece_to_token": piece_to_token,
        "candidate_start": example.candidates[:, 0], "candidate_end": example.candidates[:, 1],
        "candidate_top_level": example.candidates[:, 2].astype(bool),
        "long_start": long.start, "long_end": long.end, "long_candidate": targets.long_candidate if targets else -1,
        "short_start": [s.start for s in short], "short_end": [s.end for s in short],
    }
    for name in EXAMPLE_COLUMNS:
        rows[name].append(values[name])


# --- pieces <-> whitespace tokens ---------------------------------------------------------------

WORD_CACHE_SIZE = 200_000
"""Distinct whitespace tokens whose pieces a featurising process remembers (~30 MB)."""
_PER_CHARACTER_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
_WORD_SPLITTING_PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits"}


def tokenizes_words_independently(tokenizer: Tokenizer) -> bool:
    """Whether a space-separated token always gets the same pieces, whatever surrounds it: true
    for WordPiece behind whitespace-splitting pre-tokenizers and per-character normalisers (the
    BERT family); false for byte-level BPE and SentencePiece, whose pieces mark a preceding space."""
    config = json.loads(tokenizer.to_str())

    def parts(component: dict | None) -> list[str]:
        if component is None:
            return []
        nested = component.get("normalizers") or component.get("pretokenizers")
        return [kind for part in nested for kind in parts(part)] if nested is not None else [component["type"]]

    normalizers, pre_tokenizers = parts(config.get("normalizer")), parts(config.get("pre_tokenizer"))
    return (config["model"]["type"] == "WordPiece"
            and set(normalizers) <= _PER_CHARACTER_NORMALIZERS
            and bool(pre_tokenizers) and set(pre_tokenizers) <= _WORD_SPLITTING_PRE_TOKENIZERS
            and any(p in ("BertPreTokenizer", "Whitespace", "WhitespaceSplit") for p in pre_tokenizers))


def blank_tags(document: str) -> str:
    """The document with every HTML tag token replaced by spaces of the same length."""
    return TAG_TOKEN.sub(lambda match: " " * (match.end() - match.start()), document)


def pieces_of(document: str, blanked: str, ids: Sequence[int],
              offsets: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(piece ids, whitespace-token index of each piece) of ``blanked`` (= ``blank_tags(document)``)
    tokenised into ``ids`` with character ``offsets``.

    A piece with text belongs to the token that holds its last character. A piece of space alone (byte-level
    BPE's ``Ġ``, SentencePiece's ``▁``; its offsets may be empty) is the leading space of the word right after
    it when a character of text follows (``Ġ`` ``P`` ``aris``): it belongs to that word, as in the tokenizer's
    own encoding of the text. Any other is a run of blanked tag space and is dropped.
    """
    if not ids:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int32)
    token_starts = np.concatenate([[0], np.flatnonzero(_chars(document) == SPACE) + 1])
    spans = np.asarray(offsets, dtype=np.int64)
    is_text = _chars(blanked) != SPACE
    text_before = np.concatenate([[0], np.cumsum(is_text)])  # characters of text before each position
    has_text = text_before[spans[:, 1]] > text_before[spans[:, 0]]
    text_follows = (spans[:, 1] < len(is_text)) & is_text[np.minimum(spans[:, 1], len(is_text) - 1)]
    kept = has_text | text_follows
    anchor = np.where(has_text, spans[:, 1] - 1, spans[:, 1])[kept]  # the character whose token it is
    piece_to_token = np.searchsorted(token_starts, anchor, side="right") - 1
    return np.asarray(ids, dtype=np.int64)[kept], piece_to_token.astype(np.int32)


def _chars(text: str) -> np.ndarray:
    """Code points of ``text``: the indices match Python string (and tokenizer offset) indices."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def token_span_to_pieces(piece_to_token: np.ndarray, span: Span) -> tuple[int, int]:
    """Inclusive (first, last) piece indices covering the whitespace tokens of ``span``;
    first > last when the span holds no piece."""
    first = int(np.searchsorted(piece_to_token, span.start, side="left"))
    last = int(np.searchsorted(piece_to_token, span.end, side="left")) - 1
    return first, last


def window_span_to_tokens(piece_to_token: np.ndarray, doc_start: int, document_offset: int,
                          start_position: int, end_position: int) -> Span:
    """A span of window positions (inclusive, inside the document part) as document tokens; ``document_offset``
    is the window position of the piece ``doc_start`` (:meth:`PairTemplate.document_offset`)."""
    offset = doc_start - document_offset
    return Span(int(piece_to_token[start_position + offset]), int(piece_to_token[end_position + offset]) + 1)


def containing_candidate(candidates: np.ndarray, span: Span) -> int:
    """Index of the innermost top-level candidate that contains ``span``; -1 if none."""
    starts, ends = candidates[:, 0].astype(np.int64), candidates[:, 1].astype(np.int64)
    inside = (starts <= span.start) & (span.end <= ends) & candidates[:, 2].astype(bool)
    if not inside.any():
        return -1
    return int(np.argmin(np.where(inside, ends - starts, np.iinfo(np.int64).max)))
