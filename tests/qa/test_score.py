"""The Kaggle micro-F1 metric, gold and submission files, and `python -m distqa.score`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from distqa.qa.answers import Answer, Gold
from distqa.qa.commands.score import build_arg_parser
from distqa.qa.nq.metric import (
    Counts,
    SubmissionError,
    judge,
    read_gold,
    read_submission,
    score_answers,
    write_submission,
)
from distqa.qa.nq.reader import DataError, parse_annotations
from distqa.score import main

from support.nq_examples import UNDECODABLE_LINES, UNDECODABLE_REASONS, document, line, write_jsonl
from support.processes import clean_env
from support.repo import REPO_ROOT

SAMPLE_GOLD = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-test-gold.jsonl"
SAMPLE_TEST = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-test.jsonl"
SQUAD_DEV = REPO_ROOT / "data" / "squad-sample" / "dev.json"

# Tokens 0-5 are the title and <H1>; candidate 0 is [6, 12) ("<P> north river flows past </P>"), candidate 1
# [12, 19) (a <P> of five words).
TOKENS, CANDIDATES = document([["north", "river", "flows", "past"], ["old", "stone", "bridges", "while", "play"]])
LONG_0, LONG_1 = "6:12", "12:19"


def annotation(answer: str = "none", candidate: int = -1, short: list[tuple[int, int]] = ()) -> dict[str, Any]:
    return line(0, TOKENS, CANDIDATES, answer=answer, candidate=candidate, short=short)["annotations"][0]


def record(example_id: int, *annotations: dict[str, Any]) -> dict[str, Any]:
    """A train-format line with the given annotations (default: one without an answer)."""
    return {**line(example_id, TOKENS, CANDIDATES), "annotations": list(annotations) or [annotation()]}


def gold(long: set[str] = frozenset(), short: set[str] = frozenset()) -> Gold:
    return Gold(frozenset(long), frozenset(short))


def counts(c: Counts) -> tuple[int, int, int]:
    return c.tp, c.fp, c.fn


# --- one row ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("predicted", "golds", "expected"), [
    (LONG_0, {LONG_0}, (1, 0, 0)),          # long: the gold span
    (LONG_1, {LONG_0}, (0, 1, 0)),          # long: a wrong span where a gold exists is one FP, not also an FN
    (LONG_0, set(), (0, 1, 0)),             # long: an answer where there is none
    ("", {LONG_0}, (0, 0, 1)),              # long: blank where a gold exists
    ("", set(), (0, 0, 0)),                 # blank where there is nothing to find: not counted
    ("YES", {"YES"}, (1, 0, 0)),
    ("YES", {"NO"}, (0, 1, 0)),
    ("YES", {"7:8"}, (0, 1, 0)),
    ("7:8", {"YES"}, (0, 1, 0)),
    ("7:9", {"7:8", "8:9"}, (0, 1, 0)),     # the union of two gold spans is not a gold span
    (" 7:8 ", {"7:8"}, (1, 0, 0)),
], ids=["long-tp", "long-wrong-span-fp", "long-no-gold-fp", "long-blank-fn", "blank-no-gold", "yes-yes-tp",
        "yes-no-fp", "yes-span-fp", "span-yes-fp", "union-of-spans-fp", "spaces-stripped"])
def test_judge_counts_each_row_as_kaggle_defines(predicted: str, golds: set[str],
                                                 expected: tuple[int, int, int]) -> None:
    assert counts(judge(predicted, frozenset(golds))) == expected


def test_gold_is_the_union_of_every_annotation() -> None:
    raw = json.dumps(record(7,
                            annotation("short", 0, [(7, 8), (8, 10)]),
                            annotation("short", 1, [(13, 15)]),
                            annotation(),
                            annotation("yes", 0)))
    example_id, targets = parse_annotations(raw)
    assert example_id == 7 and len(targets) == 4
    g = Gold.from_targets(targets)
    assert g == gold({LONG_0, LONG_1}, {"7:8", "8:10", "13:15", "YES"})
    assert counts(judge("8:10", g.short)) == (1, 0, 0)   # the second of several short spans
    assert counts(judge("13:15", g.short)) == (1, 0, 0)  # a span of the second annotation
    assert counts(judge("YES", g.short)) == (1, 0, 0)
    assert counts(judge("NO", g.short)) == (0, 1, 0)
    assert counts(judge(LONG_1, g.long)) == (1, 0, 0)    # the second annotation's long answer
    assert counts(judge("", g.short)) == (0, 0, 1)
    # One annotation without an answer: nothing to find; NO alone: the short gold is NO.
    assert Gold.from_targets(parse_annotations(json.dumps(record(8)))[1]) == gold()
    assert Gold.from_targets(parse_annotations(json.dumps(record(9, annotation("no", 1))))[1]) == gold({LONG_1},
                                                                                                     {"NO"})


def test_counts_add_and_are_zero_without_rows() -> None:
    total = Counts(1, 2, 3) + Counts(4, 5, 6)
    assert counts(total) == (5, 7, 9)
    assert (Counts().precision, Counts().recall, Counts().f1) == (0.0, 0.0, 0.0)
    assert (Counts(fp=2).precision, Counts(fn=1).recall, Counts(fp=1, fn=1).f1) == (0.0, 0.0, 0.0)
    assert (Counts(3, 1, 2).precision, Counts(3, 1, 2).recall, Counts(3, 1, 2).f1) == (3 / 4, 3 / 5, 6 / 9)


# --- a whole submission ---------------------------------------------------------------------------

def test_micro_f1_pools_long_and_short_rows_computed_by_hand() -> None:
    golds = {
        1: gold({LONG_0}, {"7:8"}),     # long TP, short TP
        2: gold({LONG_0}),              # long FP (wrong span), short blank with no gold: nothing
        3: gold(),                      # long FP, short FP (answers where there are none)
        4: gold({LONG_1}, {"NO"}),      # long FN, short TP
        -5: gold({LONG_0}, {"8:9"}),    # long TP, short FN
    }
    answers = {1: Answer(LONG_0, "7:8"), 2: Answer(LONG_1, ""), 3: Answer(LONG_0, "YES"), 4: Answer("", "NO"),
               -5: Answer(LONG_0, "")}
    result = score_answers(golds, answers)
    assert list(result) == ["micro_f1", "long_f1", "short_f1", "precision", "recall", "tp", "fp", "fn",
                            "examples"]
    # long: TP 2, FP 2, FN 1; short: TP 2, FP 1, FN 1; all rows: TP 4, FP 3, FN 2.
    assert (result["tp"], result["fp"], result["fn"], result["examples"]) == (4, 3, 2, 5)
    exact = {key: Fraction(result[key]).limit_denominator(100) for key in result}
    assert exact["long_f1"] == Fraction(4, 7)        # 2·2 / (2·2 + 2 + 1)
    assert exact["short_f1"] == Fraction(2, 3)       # 2·2 / (2·2 + 1 + 1)
    assert exact["micro_f1"] == Fraction(8, 13)      # 2·4 / (2·4 + 3 + 2), not the mean of the two (13/21)
    assert exact["precision"] == Fraction(4, 7)
    assert exact["recall"] == Fraction(2, 3)
    assert (result["micro_f1"], result["precision"], result["recall"]) == (8 / 13, 4 / 7, 4 / 6)


def test_answers_must_cover_exactly_the_gold_examples() -> None:
    golds = {1: gold(), 2: gold()}
    with pytest.raises(ValueError, match=r"1 gold example\(s\) have no answer \(first: \[2\]\), 0 answer"):
        score_answers(golds, {1: Answer("", "")})
    with pytest.raises(ValueError, match=r"1 answer\(s\) are for examples not in the gold \(first: \[3\]\)"):
        score_answers(golds, {1: Answer("", ""), 2: Answer("", ""), 3: Answer("", "")})


# --- submission files ------------------------------------------------------------------------------

GOOD_ROWS = ["example_id,PredictionString", "1_long,6:11", "1_short,YES", "-2_long,", "-2_short,7:8"]
IDS = {1, -2}


def csv_file(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "submission.csv"
    path.write_text("".join(row + "\n" for row in rows))
    return path


def test_read_submission_reads_the_rows_and_tolerates_spaces_zeros_and_blank_lines(tmp_path: Path) -> None:
    assert read_submission(csv_file(tmp_path, GOOD_ROWS), IDS) == {1: Answer("6:11", "YES"), -2: Answer("", "7:8")}
    rows = ["example_id,PredictionString", "1_short, NO ", "", "1_long,006:11", "-2_short,  ", "-2_long,11:17"]
    answers = read_submission(csv_file(tmp_path, rows))
    assert answers == {1: Answer("6:11", "NO"), -2: Answer("11:17", "")}


def replace(row: int, new: str | None) -> list[str]:
    """GOOD_ROWS with row ``row`` (0 = header) replaced, or removed when ``new`` is None."""
    rows = list(GOOD_ROWS)
    if new is None:
        del rows[row]
    else:
        rows[row] = new
    return rows


MALFORMED_SUBMISSIONS = {
    # case: (rows, line, row id in the message or None, what the message says)
    "wrong header": (replace(0, "id,prediction"), 1, None, "the header is 'id,prediction'; it must be "
                                                            "'example_id,PredictionString'"),
    "three fields": (replace(2, "1_short,YES,7:8"), 3, "1_short", "has 3 field(s)"),
    "one field": (replace(4, "-2_long"), 5, "-2_long", "has 1 field(s)"),
    "unknown suffix": (replace(1, "1_longer,6:11"), 2, "1_longer", "not <example_id>_long or <example_id>_short"),
    "id not an integer": (replace(1, "abc_long,6:11"), 2, "abc_long", "not <example_id>_long"),
    "repeated row": ([*GOOD_ROWS, "1_long,11:17"], 6, "1_long", "repeats line 2"),
    "example not in the gold": ([*GOOD_ROWS, "3_long,", "3_short,"], 6, "3_long", "example 3 is not in the gold"),
    "YES in a long row": (replace(1, "1_long,YES"), 2, "1_long", "YES is only allowed in a _short row"),
    "several spans": (replace(4, "-2_short,7:8 9:10"), 5, "-2_short", "holds 2 answers; only one span is allowed"),
    "start not before end": (replace(1, "1_long,11:6"), 2, "1_long", "has start >= end"),
    "empty span": (replace(1, "1_long,6:6"), 2, "1_long", "has start >= end"),
    "negative start": (replace(1, "1_long,-1:6"), 2, "1_long", "is not blank, start:end"),
    "lower-case yes": (replace(2, "1_short,yes"), 3, "1_short", "is not blank, start:end"),
    "text": (replace(2, "1_short,north river"), 3, "1_short", "is not blank, start:end"),
    "half a span": (replace(2, "1_short,7:"), 3, "1_short", "is not blank, start:end"),
}


@pytest.mark.parametrize("case", list(MALFORMED_SUBMISSIONS))
def test_each_malformed_submission_names_file_line_and_row(case: str, tmp_path: Path) -> None:
    rows, number, row_id, message = MALFORMED_SUBMISSIONS[case]
    path = csv_file(tmp_path, rows)
    with pytest.raises(SubmissionError) as err:
        read_submission(path, IDS)
    text = str(err.value)
    assert text.startswith(f"{path}:{number}: "), text
    assert message in text
    if row_id is not None:
        assert f"row {row_id!r}" in text
    assert "\n" not in text


def test_missing_rows_name_the_example_and_count(tmp_path: Path) -> None:
    path = csv_file(tmp_path, replace(4, None))  # no -2_short
    with pytest.raises(SubmissionError, match=r"example -2 has no -2_short row; 1 row\(s\) are missing in all"):
        read_submission(path, IDS)
    with pytest.raises(SubmissionError, match="example -2 has no -2_short row"):
        read_submission(path)  # an example with one row is incomplete even without the gold
    path = csv_file(tmp_path, GOOD_ROWS)
    with pytest.raises(SubmissionError, match=r"example 3 has no rows; 2 row\(s\) are missing in all"):
        read_submission(path, {*IDS, 3})
    path = csv_file(tmp_path, [GOOD_ROWS[0]])
    missing_both = r"4 row\(s\) are missing in all \(0 example\(s\) lack one of their two rows, 2 lack both\)"
    with pytest.raises(SubmissionError, match=missing_both):
        read_submission(path, IDS)


def test_empty_missing_and_unreadable_submissions(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SubmissionError, match=f"{empty}: the file is empty"):
        read_submission(empty, IDS)
    with pytest.raises(SubmissionError, match=f"{tmp_path / 'nope.csv'}: no such submission file"):
        read_submission(tmp_path / "nope.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"example_id,PredictionString\n1_long,\xff\n")
    with pytest.raises(SubmissionError, match=f"{binary}:2: not UTF-8"):
        read_submission(binary)
    quoted = csv_file(tmp_path, [*GOOD_ROWS, '3_long,"6:11'])
    with pytest.raises(SubmissionError, match="not readable as CSV"):
        read_submission(quoted)


@pytest.mark.parametrize("case", list(UNDECODABLE_LINES))
def test_an_undecodable_submission_line_names_file_and_line(case: str, tmp_path: Path) -> None:
    path = tmp_path / "submission.csv"
    path.write_bytes(b"".join(row.encode() + b"\n" for row in GOOD_ROWS[:3]) + UNDECODABLE_LINES[case] + b"\n")
    with pytest.raises(SubmissionError) as err:
        read_submission(path, IDS)
    text = str(err.value)
    assert text.startswith(f"{path}:4") and "\n" not in text, text
    assert "not UTF-8" in text or "field(s)" in text or "not readable as CSV" in text, text


def test_write_then_read_gives_the_same_answers(tmp_path: Path) -> None:
    answers = {5: Answer("6:11", "7:8"), -3: Answer("", "NO"), 2**63 - 1: Answer("11:17", ""), 0: Answer("", "YES")}
    path = tmp_path / "out" / "submission.csv"
    write_submission(path, answers)
    assert path.read_text().splitlines()[:5] == ["example_id,PredictionString", "5_long,6:11", "5_short,7:8",
                                                 "-3_long,", "-3_short,NO"]
    read = read_submission(path, answers.keys())
    assert read == answers and list(read) == list(answers)
    assert [p.name for p in path.parent.iterdir()] == ["submission.csv"]  # no temporary left behind
    with pytest.raises(ValueError, match="YES is only allowed in a _short row"):
        write_submission(path, {1: Answer("YES", "")})
    assert read_submission(path) == answers  # a refused write leaves the old file


# --- gold files ------------------------------------------------------------------------------------

def test_read_gold_reads_every_annotation(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "gold.jsonl", [record(1, annotation("long", 1)), "",
                                                  record(2, annotation("short", 0, [(7, 9)]), annotation("yes", 1))])
    assert read_gold(path) == {1: gold({LONG_1}), 2: gold({LONG_0, LONG_1}, {"7:9", "YES"})}


BAD_GOLD = {
    # case: (second line, what the message says)
    "truncated line": ('{"example_id": 2, "document_text": "a b', "not valid JSON"),
    "bad span in a later annotation": (record(2, annotation(), annotation("short", 0, [(9, 7)])),
                                       "field 'annotations[1].short_answers[0]': span [9, 7)"),
    "test-format line": ({k: v for k, v in record(2).items() if k != "annotations"},
                         "looks like the test file, which has no answers: a gold file must be in the train format"),
    "no annotations": (record(2) | {"annotations": []}, "field 'annotations' is empty"),
    "repeated example_id": (record(1), "example_id 1 repeats line 1"),
    **{f"{case} line": (raw, UNDECODABLE_REASONS[case]) for case, raw in UNDECODABLE_LINES.items()},
}


@pytest.mark.parametrize("case", list(BAD_GOLD))
def test_a_bad_gold_line_is_an_error_naming_file_and_line(case: str, tmp_path: Path) -> None:
    bad, message = BAD_GOLD[case]
    path = write_jsonl(tmp_path / "gold.jsonl", [record(1), bad, record(3)])
    with pytest.raises(DataError) as err:
        read_gold(path)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value), str(err.value)


def test_an_empty_or_missing_gold_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gold.jsonl"
    path.write_text("\n")
    with pytest.raises(DataError, match="holds no examples"):
        read_gold(path)
    with pytest.raises(DataError, match=f"{tmp_path / 'nope.jsonl'}: no such gold file"):
        read_gold(tmp_path / "nope.jsonl")


# --- the committed sample and the command line ---------------------------------------------------

def sample_answers(perfect: bool) -> dict[int, Answer]:
    golds = read_gold(SAMPLE_GOLD)
    if not perfect:
        return {i: Answer("", "") for i in golds}
    return {i: Answer(min(g.long, default=""), min(g.short, default="")) for i, g in golds.items()}


def test_a_perfect_submission_for_the_sample_scores_1_and_a_blank_one_0() -> None:
    golds = read_gold(SAMPLE_GOLD)
    test_ids = [json.loads(raw)["example_id"] for raw in SAMPLE_TEST.read_text().splitlines()]
    assert list(golds) == test_ids  # the gold answers exactly the committed test file
    assert sum(bool(g.short) for g in golds.values()) > 10  # enough answers to prove something
    perfect = score_answers(golds, sample_answers(perfect=True))
    assert (perfect["micro_f1"], perfect["long_f1"], perfect["short_f1"], perfect["fp"], perfect["fn"]) == (
        1.0, 1.0, 1.0, 0, 0)
    blank = score_answers(golds, sample_answers(perfect=False))
    rows_with_gold = sum(bool(g.long) + bool(g.short) for g in golds.values())
    assert (blank["micro_f1"], blank["tp"], blank["fp"], blank["fn"]) == (0.0, 0, 0, rows_with_gold)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "distqa.score", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_cli_prints_one_json_object_and_fails_with_one_line(tmp_path: Path) -> None:
    submission = tmp_path / "submission.csv"
    write_submission(submission, sample_answers(perfect=True))
    done = run_cli("--gold", str(SAMPLE_GOLD), "--submission", str(submission))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["micro_f1"] == 1.0 and result["examples"] == 40 and done.stdout.count("\n") == 1

    rows = submission.read_text().splitlines()
    rows[3] = rows[3].split(",")[0] + ",1:2 3:4"
    submission.write_text("\n".join(rows) + "\n")
    done = run_cli("--gold", str(SAMPLE_GOLD), "--submission", str(submission))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"distqa.score: error: {submission}:4: row ") and done.stderr.count("\n") == 1
    assert "only one span is allowed" in done.stderr


def test_cli_errors_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.csv"
    assert main(["--gold", str(SAMPLE_GOLD), "--submission", str(missing)]) == 2
    assert capsys.readouterr().err == f"distqa.score: error: {missing}: no such submission file\n"
    assert main(["--gold", str(tmp_path / "gold.jsonl"), "--submission", str(missing)]) == 2
    assert capsys.readouterr().err == f"distqa.score: error: {tmp_path / 'gold.jsonl'}: no such gold file\n"
    submission = csv_file(tmp_path, GOOD_ROWS)
    assert main(["--gold", str(SAMPLE_TEST), "--submission", str(submission)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distqa.score: error: {SAMPLE_TEST}:1: ") and "looks like the test file" in err
    assert main(["--gold", str(SAMPLE_GOLD), "--submission", str(submission)]) == 2
    err = capsys.readouterr().err
    assert f"{submission}:2: row '1_long': example 1 is not in the gold" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["--gold", str(SAMPLE_GOLD)])
    assert exit_.value.code == 2 and "distqa.score: error:" in capsys.readouterr().err


def advised_flags(message: str) -> list[list[str]]:
    """Each flag an error message names, with the word after it where that reads as its value
    (``--on-bad-line skip``)."""
    return [found.split() for found in re.findall(r"(?<![\w-])--[a-z][a-z-]*(?: [a-z0-9][\w.-]*)?", message)]


def squad_gold_with_a_bad_record(tmp_path: Path) -> Path:
    document = json.loads(SQUAD_DEV.read_text())
    document["data"][0]["paragraphs"][0]["qas"][1]["answers"] = [{"text": 7, "answer_start": 0}]
    path = tmp_path / "gold.json"
    path.write_text(json.dumps(document))
    return path


SCORE_FAILURES = {
    # case: (the command line, given tmp_path; what the one line names)
    "squad gold with a bad record": (
        lambda tmp: ["--format", "squad", "--gold", str(squad_gold_with_a_bad_record(tmp)), "--predictions",
                     str(SQUAD_DEV)], "field 'answers[0].text' should be a string, got int 7. Fix the gold file"),
    "nq gold with a bad line": (
        lambda tmp: ["--gold", str(write_jsonl(tmp / "gold.jsonl", [record(1), "{oops"])), "--submission",
                     str(csv_file(tmp, GOOD_ROWS))], ":2: not valid JSON"),
}


@pytest.mark.parametrize("case", list(SCORE_FAILURES))
def test_a_flag_that_an_error_advises_is_one_that_score_accepts(case: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Score skips nothing (a skipped gold record would change the score), so it has no --on-bad-line: the reader's
    advice to pass one is replaced by its own. Any flag the line names is parsed by score's own parser."""
    argv, names = SCORE_FAILURES[case]
    argv = argv(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("distqa.score: error: ") and err.count("\n") == 1 and names in err, err
    for advice in advised_flags(err):
        assert build_arg_parser().parse_known_args([*argv, *advice])[1] == [], f"{advice} is not a flag of score: {err}"
