"""From window logits to one answer per example: pure functions (no process group, no model).

Decoding follows the BERT baseline for Natural Questions (Alberti et al., 2019):

1. **Per window** (:func:`distqa.qa.spans.top_spans`, on the device): the best spans ``(start, end)`` with
   ``start <= end``, at most ``max_answer_len`` wordpieces, both inside the window's document part
   (never the question or a special token: :func:`~distqa.qa.spans.document_mask`, from the tokenizer's pair template).
   A span's score is ``start_logit[start] + end_logit[end]`` minus the null score ``start_logit[0] +
   end_logit[0]`` of the first token ([CLS], <s>): above 0 the window prefers the span to "no answer
   here". Only the ``TOP_K`` best starts and ends are paired, as in HF's ``utils_qa``.
2. **Per example** (:func:`decode`): the best-scoring span over all of the example's windows,
   mapped back to whitespace-token indices of the original document. Overlapping windows see an
   answer near one window's edge whole in the next one, so a span never needs to cross a boundary.
   The long answer is the top-level candidate that contains that span, or, when none does (a span
   across two paragraphs), the candidate of the best-scoring span that lies inside one. The answer
   type comes from the answer-type head on the winning window, [CLS]'s UNKNOWN aside: YES and NO
   become the short answer ``YES``/``NO``, SHORT gives the span, LONG gives no short answer.
3. **Blank or not** (:class:`Thresholds`): the long answer is given when the example's score
   exceeds ``long``, the short one when it exceeds ``short``. :func:`tune_thresholds` picks the
   pair that maximises the Kaggle micro-F1 on the validation split; training stores it in every
   checkpoint (:class:`Decoding`, the ``nq`` task's inference state), and ``predict`` uses it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from distqa.qa.answers import YES_NO, Answer, AnswerType, Gold, Span
from distqa.qa.feature_store import list_rows
from distqa.qa.nq.windows import containing_candidate, window_span_to_tokens
from distqa.qa.spans import WindowSpans

if TYPE_CHECKING:
    import pyarrow as pa

    from distqa.qa.nq.cache import NQWindows

MAX_TUNING_THRESHOLDS = 512
"""Candidate thresholds tried per row kind when tuning (quantiles of the scores beyond this)."""


# --- per example -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Thresholds:
    """Scores above which the long and the short answer are given (blank otherwise)."""

    long: float = 0.0
    short: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """Named as the settings that override them (``long_threshold``, ``short_threshold``)."""
        return {"long_threshold": self.long, "short_threshold": self.short}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Thresholds:
        return cls(float(values["long_threshold"]), float(values["short_threshold"]))


ANSWER_EVERYTHING = Thresholds(-math.inf, -math.inf)


@dataclass(frozen=True)
class Decoding:
    """What ``predict`` needs besides the weights: the tuned thresholds and the span limit. It is the ``nq``
    task's state in a checkpoint (``task_state``), as the dict :meth:`to_dict` gives."""

    thresholds: Thresholds
    max_answer_len: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.thresholds.to_dict(), "max_answer_len": self.max_answer_len}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Decoding:
        return cls(Thresholds.from_dict(values), int(values["max_answer_len"]))


@dataclass(frozen=True)
class Prediction:
    """The decoded answer of one example, before the thresholds decide what is left blank."""

    example_id: int
    score: float
    """Best span score minus the null score; -inf when no window had a span."""
    answer_type: AnswerType
    """YES, NO, SHORT or LONG, from the answer-type head on the winning window."""
    short: Span | None
    """The best span, in whitespace tokens of the document (end exclusive)."""
    long: Span | None
    """The top-level long-answer candidate holding ``short`` (or the best span inside one)."""

    def answer(self, thresholds: Thresholds) -> Answer:
        """The submission rows: ``start:end``, ``YES``/``NO`` or blank."""
        long = self.long.text if self.long and self.score > thresholds.long else ""
        short = ""
        if self.short is not None and self.score > thresholds.short:
            if self.answer_type == AnswerType.SHORT:
                short = self.short.text
            elif self.answer_type in YES_NO:
                short = self.answer_type.name
        return Answer(long, short)


class WindowLayout(NamedTuple):
    """Where each window sits in its example (columns of the cache's windows.arrow)."""

    example_index: np.ndarray
    doc_start: np.ndarray
    """The document piece each window's document part starts with."""
    document_begin: np.ndarray
    """The window position of that piece (after the question and the template's special tokens)."""

    @classmethod
    def of(cls, windows: NQWindows) -> WindowLayout:
        return cls(windows.columns["example_index"], windows.columns["doc_start"], windows.document_begin)


class ExampleColumns(NamedTuple):
    """What decoding needs of each example (columns of the cache's examples.arrow)."""

    example_id: np.ndarray
    piece_to_token: list[np.ndarray]
    candidates: list[np.ndarray]
    """(n, 3) start_token, end_token, top_level per candidate."""

    @classmethod
    def of(cls, table: pa.Table) -> ExampleColumns:
        starts, ends, top_level = (list_rows(table.column(f"candidate_{n}")) for n in ("start", "end", "top_level"))
        candidates = [np.stack([s, e, t.astype(s.dtype)], axis=1)
                      for s, e, t in zip(starts, ends, top_level, strict=True)]
        return cls(table.column("example_id").to_numpy(), list_rows(table.column("piece_to_token")), candidates)


def decode(spans: WindowSpans, layout: WindowLayout, examples: ExampleColumns) -> list[Prediction]:
    """One :class:`Prediction` per example, in example order, from every window's candidate spans."""
    order = np.argsort(layout.example_index, kind="stable")
    bounds = np.searchsorted(layout.example_index[order], np.arange(len(examples.example_id) + 1))
    predictions = []
    for index, example_id in enumerate(examples.example_id.tolist()):
        windows = order[bounds[index]:bounds[index + 1]]
        predictions.append(_decode_example(int(example_id), windows, spans, layout,
                                           examples.piece_to_token[index], examples.candidates[index]))
    return predictions


def _decode_example(example_id: int, windows: np.ndarray, spans: WindowSpans, layout: WindowLayout,
                    piece_to_token: np.ndarray, candidates: np.ndarray) -> Prediction:
    scores = spans.score[windows].reshape(-1)
    ranked = [i for i in np.argsort(-scores, kind="stable").tolist() if np.isfinite(scores[i])]
    if not ranked:
        return Prediction(example_id, -math.inf, AnswerType.UNKNOWN, None, None)

    def token_span(flat: int) -> tuple[int, Span]:
        window, which = windows[flat // spans.score.shape[1]], flat % spans.score.shape[1]
        return window, window_span_to_tokens(piece_to_token, int(layout.doc_start[window]),
                                             int(layout.document_begin[window]), int(spans.start[window, which]),
                                             int(spans.end[window, which]))

    best_window, best = token_span(ranked[0])
    type_logits = spans.type_logits[best_window]
    answer_type = AnswerType(1 + int(np.argmax(type_logits[1:])))  # [CLS]'s null score speaks for UNKNOWN
    long = None
    for flat in ranked:
        span = best if flat == ranked[0] else token_span(flat)[1]
        candidate = containing_candidate(candidates, span) if len(candidates) else -1
        if candidate >= 0:
            long = Span(int(candidates[candidate, 0]), int(candidates[candidate, 1]))
            break
    return Prediction(example_id, float(scores[ranked[0]]), answer_type, best, long)


# --- thresholds --------------------------------------------------------------------------------

def tune_thresholds(predictions: list[Prediction], golds: dict[int, Gold], long: float | None = None,
                    short: float | None = None) -> Thresholds:
    """The (long, short) thresholds with the highest micro-F1 over ``predictions``; a threshold
    given here is kept as it is and the other tuned around it.

    A tuned threshold is placed halfway between the highest score it leaves blank and the next
    score: the widest margin on this split.
    """
    scores = np.array([p.score for p in predictions], dtype=np.float64)
    everything = [p.answer(ANSWER_EVERYTHING) for p in predictions]
    tables = []
    for kind, fixed in (("long", long), ("short", short)):
        given = np.array([getattr(a, kind) != "" for a in everything], dtype=bool)
        right = given & np.array([getattr(a, kind) in getattr(golds[p.example_id], kind)
                                  for p, a in zip(predictions, everything, strict=True)], dtype=bool)
        has_gold = np.array([bool(getattr(golds[p.example_id], kind)) for p in predictions], dtype=bool)
        candidates = _candidate_thresholds(scores[given]) if fixed is None else np.array([fixed])

        def above(mask: np.ndarray, candidates: np.ndarray = candidates) -> np.ndarray:
            """How many of the ``mask``ed examples score above each candidate threshold."""
            return mask.sum() - np.searchsorted(np.sort(scores[mask]), candidates, side="right")

        # TP: given and right; FP: given and wrong; FN: blank where a gold exists.
        false_positives = above(given & ~right)
        false_negatives = has_gold.sum() - above(given & has_gold)
        tables.append((candidates, above(right), false_positives + false_negatives, fixed))
    (long_t, long_tp, long_errors, long_fixed), (short_t, short_tp, short_errors, short_fixed) = tables
    tp = long_tp[:, None] + short_tp[None, :]
    errors = long_errors[:, None] + short_errors[None, :]
    f1 = 2 * tp / np.maximum(2 * tp + errors, 1)
    best_long, best_short = np.unravel_index(np.argmax(f1), f1.shape)
    return Thresholds(long_fixed if long_fixed is not None else _halfway(long_t[best_long], scores),
                      short_fixed if short_fixed is not None else _halfway(short_t[best_short], scores))


def _candidate_thresholds(scores: np.ndarray) -> np.ndarray:
    """-inf (answer all) and every distinct score (answer those above it), thinned to quantiles."""
    distinct = np.unique(scores[np.isfinite(scores)])
    if len(distinct) > MAX_TUNING_THRESHOLDS:
        distinct = np.unique(np.quantile(distinct, np.linspace(0, 1, MAX_TUNING_THRESHOLDS)))
    return np.concatenate([[-math.inf], distinct])


def _halfway(threshold: float, scores: np.ndarray) -> float:
    higher = scores[scores > threshold]
    if not np.isfinite(threshold):
        return float(higher.min() - 1.0) if len(higher) else 0.0
    return float((threshold + higher.min()) / 2) if len(higher) else float(threshold)


def golds_of(table: pa.Table) -> dict[int, Gold]:
    """The gold answers stored with a labelled split (its first annotation), by example id."""
    golds = {}
    columns = table.select(["example_id", "answer_type", "long_start", "long_end", "short_start",
                            "short_end"]).to_pylist()
    for row in columns:
        long = Span(row["long_start"], row["long_end"]) if row["long_start"] >= 0 else None
        short = [Span(s, e) for s, e in zip(row["short_start"], row["short_end"], strict=True)]
        golds[row["example_id"]] = Gold.of(AnswerType(row["answer_type"]), long, short)
    return golds
