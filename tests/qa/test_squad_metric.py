"""The official SQuAD v2.0 metric by hand-computed cases, the no-answer threshold against brute force, the
predictions file, decoding spans into answer text, and `python -m distqa.score --format squad`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from distqa import score
from distqa.config.errors import DataError
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.qa.spans import SPANS_PER_WINDOW, WindowSpans
from distqa.qa.squad.cache import SquadCacheRequest, SquadWindows, build_squad_cache, open_examples
from distqa.qa.squad.inference import decode_answers
from distqa.qa.squad.metric import (
    best_threshold,
    exact_match,
    f1_score,
    normalize_answer,
    question_scores,
    read_gold,
    read_predictions,
    score_predictions,
    write_predictions,
)
from distqa.qa.squad.windows import SquadWindowSettings

from support.repo import REPO_ROOT

DEV = REPO_ROOT / "data" / "squad-sample" / "dev.json"


@pytest.mark.parametrize(("text", "normalised"), [
    ("The Cat!", "cat"),
    ("An apple, the pear.", "apple pear"),
    ("  a\tb \n c ", "b c"),                     # "a" is an article; white space collapsed
    ("theory anthem", "theory anthem"),          # articles only as whole words
    ("U.S.-based", "usbased"),                   # punctuation removed, not replaced by a space
    ("Zürich — “quoted”", "zürich — “quoted”"),  # only ASCII punctuation, as the official script
    ("THE", ""),
])
def test_normalisation_is_the_official_one(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_exact_match_and_f1_by_hand() -> None:
    assert exact_match("The Eiffel Tower", "eiffel tower.") == 1.0
    assert f1_score("the cat sat", "cat sat down") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))  # P 2/3, R 1
    assert f1_score("a b b c", "b b b") == pytest.approx(2 * (2 / 3) * (2 / 3) / (4 / 3))  # bags: 2 b's shared
    assert f1_score("red", "blue") == 0.0
    # The best over the golds, each score separately.
    assert question_scores(["Paris", "the city of Paris"], "city of paris") == (1.0, 1.0)
    assert question_scores(["Paris France", "Lyon"], "Paris") == (0.0, pytest.approx(2 / 3))


def test_no_gold_answer_means_only_no_answer_is_right() -> None:
    assert question_scores([], "") == (1.0, 1.0)
    assert question_scores([], "Paris") == (0.0, 0.0)
    assert question_scores(["The", "."], "") == (1.0, 1.0)  # golds that normalise to nothing are no answer
    assert question_scores(["Paris"], "") == (0.0, 0.0)


def test_the_official_names_and_numbers() -> None:
    golds = {"a": ["Paris", "the Paris city"], "b": [], "c": ["x y z"], "d": ["."]}
    predictions = {"a": "paris city", "b": "", "c": "y z w", "d": ""}
    result = score_predictions(golds, predictions)
    # a: exact 1, F1 1; b: 1, 1; c: 0, 2/3; d: its gold normalises to nothing, so "" is right (1, 1), and it still
    # counts as a question with answers (the official script decides that by the raw answer list).
    assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                            "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert result["total"] == 4 and result["HasAns_total"] == 3 and result["NoAns_total"] == 1
    assert result["exact"] == pytest.approx(75.0) and result["f1"] == pytest.approx(100 * (3 + 2 / 3) / 4)
    assert result["HasAns_exact"] == pytest.approx(200 / 3)
    assert result["HasAns_f1"] == pytest.approx(100 * (2 + 2 / 3) / 3)
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (100.0, 100.0)
    assert set(score_predictions({"a": ["x"]}, {"a": "x"})) == {"exact", "f1", "total", "HasAns_exact", "HasAns_f1",
                                                                "HasAns_total"}  # SQuAD v1.1: no NoAns_*
    assert set(score_predictions({"b": []}, {"b": ""})) == {"exact", "f1", "total", "NoAns_exact", "NoAns_f1",
                                                            "NoAns_total"}


def test_the_tuned_threshold_is_as_good_as_the_best_found_by_brute_force() -> None:
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 12))
        scores = rng.choice([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0, -np.inf], size=n)  # ties and no-span questions too
        f1 = rng.choice([0.0, 0.5, 1.0], size=n)
        answerable = rng.random(n) < 0.6
        f1 = np.where(answerable, f1, 0.0)  # an answer to an unanswerable question scores 0

        def total(threshold: float, scores: np.ndarray = scores, f1: np.ndarray = f1,
                  answerable: np.ndarray = answerable) -> float:
            """Total F1: the answered questions' F1, and 1 for each right abstention."""
            return float(np.where(scores > threshold, f1, ~answerable).sum())

        best = max(total(t) for t in [-np.inf, *np.unique(scores[np.isfinite(scores)])])
        threshold = best_threshold(scores, f1, answerable)
        assert total(threshold) == pytest.approx(best), trial
        assert not np.isinf(threshold) and not (scores == threshold).any(), trial  # halfway, never on a score


# --- files ---------------------------------------------------------------------------------------------

def test_the_gold_of_the_committed_sample() -> None:
    golds = read_gold(DEV)
    assert len(golds) == 119 and sum(not answers for answers in golds.values()) == 40


BAD_PREDICTIONS = {
    "missing question": (lambda ids: {i: "" for i in ids[1:]}, "has no answer for 1 question(s), e.g. 'a'"),
    "unknown question": (lambda ids: {**{i: "" for i in ids}, "zz": "x"}, "answers questions the gold does not have"),
    "a number": (lambda ids: {**{i: "" for i in ids}, "b": 3}, "the answer of 'b' should be a string"),
    "a list": (lambda ids: [""], "expected a JSON object {question id: answer text}, got list"),
}


@pytest.mark.parametrize("case", list(BAD_PREDICTIONS))
def test_a_bad_predictions_file_is_refused_naming_the_question(case: str, tmp_path: Path) -> None:
    make, message = BAD_PREDICTIONS[case]
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(make(["a", "b"])))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("{", r"\{")
                       .replace("}", r"\}")):
        read_predictions(path, ["a", "b"])


def test_predictions_that_are_not_json_or_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "predictions.json"
    path.write_text('{"a": "x",')
    with pytest.raises(DataError, match=rf"{path}:1:11: not valid JSON"):
        read_predictions(path, ["a"])
    path.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(DataError, match="not UTF-8 text"):
        read_predictions(path, ["a"])
    write_predictions(path, {"b": "Zürich", "a": ""})
    assert list(read_predictions(path, ["a", "b"]).items()) == [("b", "Zürich"), ("a", "")]  # the order kept


# --- decoding window spans into text ---------------------------------------------------------------------

def test_the_best_span_over_a_questions_windows_is_cut_from_its_context(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    request = SquadCacheRequest.from_tokenizer(tokenizer, DEV, SquadWindowSettings(40, 16, 8), labelled=False)
    directory = build_squad_cache(request, tmp_path / "cache")
    windows, examples = SquadWindows(directory, "test"), open_examples(directory, "test")
    index = windows.columns["example_index"]
    first = int(np.flatnonzero(np.bincount(index) >= 2)[0])  # a question with two windows or more
    own = np.flatnonzero(index == first)
    n = len(windows)
    score = np.full((n, SPANS_PER_WINDOW), -np.inf, dtype=np.float32)
    start = np.zeros((n, SPANS_PER_WINDOW), dtype=np.int64)
    end = np.zeros((n, SPANS_PER_WINDOW), dtype=np.int64)
    context_start = windows.columns["context_start"]
    # The question's second window holds the best span: its 2nd to 4th context tokens.
    score[own[0], 0], start[own[0], 0], end[own[0], 0] = 1.0, context_start[own[0]], context_start[own[0]]
    score[own[1], 0], start[own[1], 0], end[own[1], 0] = 2.5, context_start[own[1]] + 1, context_start[own[1]] + 3
    spans = WindowSpans(score, start, end, np.zeros((n, 5), dtype=np.float32))
    predictions = decode_answers(spans, windows, examples)
    assert len(predictions) == examples.num_rows
    chosen = predictions[first]
    context = examples.column("context")[first].as_py()
    offsets = windows.offsets()[own[1]]
    assert chosen.text == context[offsets[1, 0]:offsets[3, 1]] and chosen.score == 2.5
    assert chosen.answer(2.4) == chosen.text and chosen.answer(2.5) == ""
    others = [p for i, p in enumerate(predictions) if i != first]
    assert all(p.text == "" and p.score == -np.inf for p in others)  # no span at all: no answer


# --- the command line ------------------------------------------------------------------------------------

def run_score(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = score.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_score_prints_the_official_metrics_of_the_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    golds = read_gold(DEV)
    perfect, blank = tmp_path / "perfect.json", tmp_path / "blank.json"
    write_predictions(perfect, {i: answers[0] if answers else "" for i, answers in golds.items()})
    write_predictions(blank, {i: "" for i in golds})
    code, out, _ = run_score(capsys, "--format", "squad", "--gold", str(DEV), "--predictions", str(perfect))
    assert code == 0 and out.count("\n") == 1
    assert json.loads(out) == {"exact": 100.0, "f1": 100.0, "total": 119, "HasAns_exact": 100.0, "HasAns_f1": 100.0,
                               "HasAns_total": 79, "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 40}
    code, out, _ = run_score(capsys, "--format", "squad", "--gold", str(DEV), "--predictions", str(blank))
    result = json.loads(out)
    assert (result["HasAns_f1"], result["NoAns_f1"]) == (0.0, 100.0) and result["f1"] == pytest.approx(4000 / 119)


def test_score_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"x": ""}))
    code, _, err = run_score(capsys, "--format", "squad", "--gold", str(DEV), "--predictions", str(predictions))
    assert code == 2 and err.startswith(f"distqa.score: error: {predictions} has no answer for 119 question(s)")
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as usage:
        run_score(capsys, "--format", "squad", "--gold", str(DEV))
    assert usage.value.code == 2 and "the following arguments are required: --predictions" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_score(capsys, "--format", "squad", "--gold", str(DEV), "--predictions", str(predictions),
                  "--submission", "x.csv")
    assert "--submission is for --format nq; give --predictions" in capsys.readouterr().err
    code, _, err = run_score(capsys, "--format", "squad", "--gold", str(tmp_path / "dev.json"), "--predictions",
                             str(predictions))
    assert code == 2 and err == f"distqa.score: error: {tmp_path / 'dev.json'}: no such gold file\n"
