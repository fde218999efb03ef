"""Decoding on constructed logits, threshold tuning against brute force, and the checkpoint's decoding state."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from distqa.encoders.template import PairTemplate
from distqa.qa.answers import Answer, AnswerType, Gold, Span
from distqa.qa.nq.decode import (
    ANSWER_EVERYTHING,
    ExampleColumns,
    Prediction,
    Thresholds,
    WindowLayout,
    decode,
    golds_of,
    tune_thresholds,
)
from distqa.qa.nq.metric import read_gold, score_answers
from distqa.qa.spans import WindowSpans, document_mask, merge_gathered, top_spans

from support.repo import REPO_ROOT

# A window of 12 positions: [CLS] q q [SEP] d d d d d d d [SEP]  (question_len 2, document at 4..10)
LENGTH, QUESTION_LEN = 12, 2
DOC = range(QUESTION_LEN + 2, LENGTH - 1)


def window_mask(batch: int = 1, length: int = LENGTH) -> torch.Tensor:
    """The document mask of ``batch`` windows of ``length`` tokens in BERT's template."""
    template = PairTemplate.bert(cls_id=2, sep_id=3)
    begin = torch.full((batch,), template.document_offset(QUESTION_LEN))
    return document_mask(begin, torch.full((batch,), length - len(template.suffix)), 16)


def logits_with(points: dict[int, float], base: float = -5.0) -> torch.Tensor:
    values = torch.full((1, 16), base)
    for position, value in points.items():
        values[0, position] = value
    return values


def spans_of(start: dict[int, float], end: dict[int, float], max_answer_len: int = 30,
             types: list[float] | None = None) -> WindowSpans:
    type_logits = torch.tensor([types or [0.0, 0, 0, 1, 0]])
    return top_spans(logits_with(start), logits_with(end), window_mask(), type_logits, max_answer_len)


def test_the_document_part_excludes_question_cls_and_both_seps() -> None:
    assert window_mask()[0].nonzero().flatten().tolist() == list(DOC)


def test_the_best_span_is_scored_against_the_null_answer() -> None:
    found = spans_of({0: 1.0, 5: 4.0}, {0: 2.0, 7: 3.0})
    assert (found.start[0, 0].item(), found.end[0, 0].item()) == (5, 7)
    assert found.score[0, 0].item() == pytest.approx(4.0 + 3.0 - (1.0 + 2.0))


def test_spans_never_start_or_end_outside_the_document() -> None:
    # The question (1, 2), [CLS] and the final [SEP] (11) have the highest logits, and lose.
    found = spans_of({1: 9.0, 0: 9.0, 6: 1.0}, {2: 9.0, 11: 9.0, 8: 1.0})
    starts, ends = found.start[0].tolist(), found.end[0].tolist()
    assert (starts[0], ends[0]) == (6, 8)
    finite = found.score[0].isfinite().tolist()
    assert all(s in DOC and e in DOC and s <= e for s, e, ok in zip(starts, ends, finite, strict=True) if ok)


def test_the_end_never_precedes_the_start() -> None:
    found = spans_of({8: 5.0, 4: 1.0}, {5: 5.0, 9: 1.0})
    assert (found.start[0, 0].item(), found.end[0, 0].item()) in {(8, 9), (4, 5)}
    assert all(s <= e for s, e in zip(found.start[0].tolist(), found.end[0].tolist(), strict=True))


def test_the_maximum_answer_length_excludes_longer_spans() -> None:
    start, end = {4: 5.0, 7: 1.0}, {10: 5.0, 8: 1.0}
    assert (spans_of(start, end).start[0, 0].item(), spans_of(start, end).end[0, 0].item()) == (4, 10)
    short = spans_of(start, end, max_answer_len=3)
    assert all(e - s + 1 <= 3 for s, e, ok in zip(short.start[0].tolist(), short.end[0].tolist(),
                                                   short.score[0].isfinite().tolist(), strict=True) if ok)
    assert short.score[0, 0].item() < spans_of(start, end).score[0, 0].item()


def test_a_window_without_document_has_no_span() -> None:
    no_document = window_mask(length=QUESTION_LEN + 3)  # [CLS] q q [SEP] [SEP]
    found = top_spans(torch.randn(1, 16), torch.randn(1, 16), no_document, torch.zeros(1, 5), 30)
    assert not found.score.isfinite().any()


# --- per example ----------------------------------------------------------------------------------

# A document of 14 whitespace tokens: tokens 0 and 13 are tags (no wordpiece), token 5 has two pieces.
PIECE_TO_TOKEN = np.array([1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11, 12], dtype=np.int32)
CANDIDATES = np.array([[0, 14, 1],    # the whole <P> … </P>: top level
                       [2, 7, 0],     # nested inside it
                       ], dtype=np.int64)


def example_columns(candidates: np.ndarray = CANDIDATES) -> ExampleColumns:
    return ExampleColumns(np.array([42]), [PIECE_TO_TOKEN], [candidates])


def windows_of(*spans: tuple[int, float, int, int],
               types: list[float] | None = None) -> tuple[WindowSpans, WindowLayout]:
    """One window per (doc_start, score, start, end) with a single candidate span each."""
    n = len(spans)
    score = np.full((n, 2), -math.inf, dtype=np.float32)
    start = np.zeros((n, 2), dtype=np.int64)
    end = np.zeros((n, 2), dtype=np.int64)
    for row, (_, value, s, e) in enumerate(spans):
        score[row, 0], start[row, 0], end[row, 0] = value, s, e
    type_logits = np.tile(np.array(types or [0.0, 0, 0, 1, 0], dtype=np.float32), (n, 1))
    layout = WindowLayout(np.zeros(n, dtype=np.int64), np.array([d for d, *_ in spans]),
                          np.full(n, QUESTION_LEN + 2))
    return WindowSpans(score, start, end, type_logits), layout


def test_an_answer_cut_by_one_window_is_taken_whole_from_the_next() -> None:
    # Windows hold 7 pieces with stride 4: window 0 = pieces 0..6, window 1 = pieces 4..10.
    # The answer is pieces 5..7 (tokens 5..6): window 0 can only offer a cut span (pieces 5..6),
    # window 1 holds it whole at positions 4+1 .. 4+3, with the higher score.
    spans, layout = windows_of((0, 1.0, 4 + 5, 4 + 6), (4, 3.0, 4 + 1, 4 + 3))
    [prediction] = decode(spans, layout, example_columns())
    assert prediction.short == Span(5, 8)   # tokens 5 (two pieces) .. 7, end exclusive
    assert prediction.score == 3.0
    assert prediction.long == Span(0, 14)   # the top-level candidate, not the nested one
    assert prediction.answer(Thresholds()) == Answer("0:14", "5:8")


def test_a_null_answer_is_blank_at_the_default_thresholds() -> None:
    spans, layout = windows_of((0, -2.0, 4, 5))
    [prediction] = decode(spans, layout, example_columns())
    assert prediction.answer(Thresholds()) == Answer("", "")
    assert prediction.answer(ANSWER_EVERYTHING) == Answer("0:14", "1:3")
    assert prediction.answer(Thresholds(long=-3.0, short=-1.0)) == Answer("0:14", "")


def test_no_span_at_all_is_always_blank() -> None:
    spans, layout = windows_of((0, -math.inf, 0, 0))
    [prediction] = decode(spans, layout, example_columns())
    assert prediction.score == -math.inf and prediction.answer(ANSWER_EVERYTHING) == Answer("", "")


@pytest.mark.parametrize(("answer_type", "short"), [(AnswerType.YES, "YES"), (AnswerType.NO, "NO"),
                                                    (AnswerType.SHORT, "1:3"), (AnswerType.LONG, "")])
def test_the_answer_type_head_decides_the_short_answer(answer_type: AnswerType, short: str) -> None:
    types = [5.0, 0, 0, 0, 0]  # UNKNOWN highest: [CLS]'s null score, not the type head, decides blanks
    types[answer_type] = 1.0
    spans, layout = windows_of((0, 2.0, 4, 5), types=types)
    [prediction] = decode(spans, layout, example_columns())
    assert prediction.answer_type == answer_type
    assert prediction.answer(Thresholds()) == Answer("0:14", short)


def test_the_long_answer_falls_back_to_the_best_span_inside_a_candidate() -> None:
    candidates = np.array([[0, 4, 1], [4, 14, 1]], dtype=np.int64)  # two top-level paragraphs
    # The best span crosses both paragraphs (tokens 3..5); the runner-up lies inside the second.
    spans, layout = windows_of((0, 5.0, 4 + 2, 4 + 4), (0, 1.0, 4 + 6, 4 + 7))
    [prediction] = decode(spans, layout, ExampleColumns(np.array([42]), [PIECE_TO_TOKEN], [candidates]))
    assert prediction.short == Span(3, 6)
    assert prediction.long == Span(4, 14)


def test_examples_collect_their_windows_wherever_they_are() -> None:
    # Two examples whose windows are interleaved in the window order.
    score = np.array([[1.0], [5.0], [2.0], [0.5]], dtype=np.float32)
    start = np.array([[4], [5], [6], [7]])
    spans = WindowSpans(score, start, start, np.tile(np.array([0, 0, 0, 1.0, 0]), (4, 1)))
    layout = WindowLayout(np.array([1, 0, 1, 0]), np.zeros(4, dtype=np.int64), np.full(4, QUESTION_LEN + 2))
    examples = ExampleColumns(np.array([7, 8]), [PIECE_TO_TOKEN, PIECE_TO_TOKEN], [CANDIDATES, CANDIDATES])
    first, second = decode(spans, layout, examples)
    assert (first.example_id, first.score, first.short) == (7, 5.0, Span(2, 3))
    assert (second.example_id, second.score, second.short) == (8, 2.0, Span(3, 4))


# --- thresholds -----------------------------------------------------------------------------------

def random_case(seed: int, n: int = 40) -> tuple[list[Prediction], dict[int, Gold]]:
    rng = np.random.default_rng(seed)
    predictions, golds = [], {}
    for i in range(n):
        kind = AnswerType(int(rng.integers(1, 5)))
        correct = rng.random() < 0.6
        span, long = Span(3, 5), Span(0, 10)
        predictions.append(Prediction(i, float(np.round(rng.normal(), 1)), kind, span, long))
        has_gold = rng.random() < 0.7
        gold_long = frozenset({"0:10" if correct else "10:20"} if has_gold else ())
        gold_short = frozenset({"3:5" if correct else "4:5", *(["YES"] if correct else [])} if has_gold else ())
        golds[i] = Gold(gold_long, gold_short)
    return predictions, golds


@pytest.mark.parametrize("seed", range(4))
def test_tuned_thresholds_reach_the_best_f1_that_any_pair_reaches(seed: int) -> None:
    predictions, golds = random_case(seed)

    def f1(thresholds: Thresholds) -> float:
        return score_answers(golds, {p.example_id: p.answer(thresholds) for p in predictions})["micro_f1"]

    tuned = tune_thresholds(predictions, golds)
    levels = sorted({p.score for p in predictions} | {-math.inf})
    brute = max(f1(Thresholds(a, b)) for a, b in itertools.product(levels, levels))
    assert f1(tuned) == pytest.approx(brute)
    assert f1(tuned) >= f1(Thresholds()) and f1(tuned) >= f1(ANSWER_EVERYTHING)


def test_a_fixed_threshold_is_kept_and_the_other_tuned() -> None:
    predictions, golds = random_case(0)
    tuned = tune_thresholds(predictions, golds, long=0.25)
    assert tuned.long == 0.25
    assert tuned.short == tune_thresholds(predictions, golds, long=0.25, short=None).short
    assert tune_thresholds(predictions, golds, long=1.0, short=-1.0) == Thresholds(1.0, -1.0)


def test_tuned_thresholds_sit_between_scores() -> None:
    predictions, golds = random_case(1)
    tuned = tune_thresholds(predictions, golds)
    scores = {p.score for p in predictions}
    assert tuned.long not in scores and tuned.short not in scores


# --- gathering and gold -----------------------------------------------------------------------------

def rank_part(windows: list[int]) -> tuple[np.ndarray, WindowSpans]:
    index = np.array(windows)
    column = index[:, None].astype(np.float32)
    return index, WindowSpans(column, column.astype(np.int64), column.astype(np.int64), np.tile(column, (1, 5)))


def test_merging_drops_the_samplers_repeats_and_restores_window_order() -> None:
    # DistributedSampler over 5 windows and 2 ranks: rank 0 gets 0, 2, 4; rank 1 gets 1, 3 and 0 again.
    merged = merge_gathered([[rank_part([0, 2]), rank_part([4])], [rank_part([1, 3]), rank_part([0])]], num_windows=5)
    assert merged.score[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert merged.type_logits.shape == (5, 5)


def test_merging_refuses_a_missing_window() -> None:
    with pytest.raises(RuntimeError, match="covered 4 of 5 windows"):
        merge_gathered([[rank_part([0, 2, 4])], [rank_part([1, 0])]], num_windows=5)


def test_the_gold_of_the_cache_is_the_gold_the_scorer_reads(tmp_path: Path) -> None:
    """Evaluation in training scores against the cache's example rows; `score` reads the jsonl: the same."""
    from transformers import AutoTokenizer

    from distqa.encoders.config import TINY_MODEL_DIR
    from distqa.qa.nq.cache import CacheRequest, build_cache, open_examples
    from distqa.qa.nq.windows import WindowSettings

    source = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-train.jsonl"
    request = CacheRequest.from_tokenizer(source, AutoTokenizer.from_pretrained(TINY_MODEL_DIR),
                                          WindowSettings(128, 32, 64, 0.1, 0), validation_fraction=0.5)
    directory = build_cache(request, tmp_path, num_proc=1, progress=False)
    from_file = read_gold(source)
    for split in ("train", "validation"):
        table = open_examples(directory, split)
        from_cache = golds_of(table)
        assert from_cache == {example_id: from_file[example_id] for example_id in from_cache}
        columns = ExampleColumns.of(table)
        rows = table.to_pylist()
        assert [c.tolist() for c in columns.piece_to_token] == [r["piece_to_token"] for r in rows]
        assert [c[:, 0].tolist() for c in columns.candidates] == [r["candidate_start"] for r in rows]
        assert [c[:, 2].astype(bool).tolist() for c in columns.candidates] == [r["candidate_top_level"] for r in rows]
