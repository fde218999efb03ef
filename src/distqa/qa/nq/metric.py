"""The Kaggle "TensorFlow 2.0 Question Answering" metric and its files: gold answers, submissions, micro F1.

A submission has the header ``example_id,PredictionString`` and two rows per example, ``<example_id>_long``
and ``<example_id>_short``, each holding one prediction: blank (no answer), ``start:end`` (whitespace-token
indices of ``document_text``, start inclusive, end exclusive, ``0 <= start < end``) or, in a short row only,
``YES`` / ``NO``. Every example of the gold needs both rows, and no other row may appear.

The metric (Kaggle's definition) is micro F1 over all long and short rows together. Each row counts as

* TP: the prediction matches one of the gold answers: for a long row, the long answer of any annotation; for a
  short row, any single short span of any annotation, or ``YES``/``NO`` matching a ``yes_no_answer``;
* FP: a prediction that matches no gold answer, whether gold answers exist or not (a wrong span where
  there is a gold answer is one FP, not also an FN);
* FN: blank where a gold answer exists;
* nothing: blank where no gold answer exists.

precision = TP/(TP+FP), recall = TP/(TP+FN), F1 = 2TP/(2TP+FP+FN) (0.0 when a denominator is 0);
``long_f1`` and ``short_f1`` are the same over the long rows or the short rows alone. Gold answers are the
union over all annotations of an example (the Kaggle train file has one, NQ dev five); this is Kaggle's
rule, not the official NQ evaluation's (which needs two of five annotators to agree that an answer exists).

``python -m distqa.score`` is its command line. Answers and golds are :class:`distqa.qa.answers.Answer` and
:class:`distqa.qa.answers.Gold`.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from distqa.checkpoint.files import atomic_write
from distqa.config.errors import DataError
from distqa.qa.answers import YES_NO as YES_NO_TYPES
from distqa.qa.answers import Answer, Gold
from distqa.qa.nq.reader import BadLine, parse_annotations

HEADER = ["example_id", "PredictionString"]
ROW_ID = re.compile(r"^(-?[0-9]+)_(long|short)$")
SPAN = re.compile(r"^([0-9]+):([0-9]+)$")
YES_NO = tuple(t.name for t in YES_NO_TYPES)


@dataclass
class Counts:
    """True positives, false positives and false negatives of some rows."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float:
        return _ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float:
        return _ratio(self.tp, self.tp + self.fn)

    @property
    def f1(self) -> float:
        return _ratio(2 * self.tp, 2 * self.tp + self.fp + self.fn)

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else 0.0


def judge(predicted: str, gold: frozenset[str]) -> Counts:
    """One row: TP if the (non-blank) prediction is one of ``gold``; FP if it is non-blank and not in
    ``gold``, empty or not; FN if it is blank and ``gold`` is not empty; nothing if both are empty."""
    predicted = predicted.strip()
    if predicted:
        return Counts(tp=1) if predicted in gold else Counts(fp=1)
    return Counts(fn=1) if gold else Counts()


def score_answers(golds: Mapping[int, Gold], answers: Mapping[int, Answer]) -> dict[str, float | int]:
    """Micro F1 over every long and short row, plus each kind alone; keys micro_f1, long_f1, short_f1,
    precision, recall, tp, fp, fn, examples.

    ``answers`` must hold exactly the example ids of ``golds`` (ValueError otherwise).
    """
    if golds.keys() != answers.keys():
        missing = [i for i in golds if i not in answers]
        extra = [i for i in answers if i not in golds]
        raise ValueError(f"the answers do not cover exactly the gold examples: {len(missing)} gold example(s) "
                         f"have no answer (first: {missing[:3]}), {len(extra)} answer(s) are for examples not in "
                         f"the gold (first: {extra[:3]})")
    long, short = Counts(), Counts()
    for example_id, gold in golds.items():
        answer = answers[example_id]
        long += judge(answer.long, gold.long)
        short += judge(answer.short, gold.short)
    total = long + short
    return {"micro_f1": total.f1, "long_f1": long.f1, "short_f1": short.f1, "precision": total.precision,
            "recall": total.recall, "tp": total.tp, "fp": total.fp, "fn": total.fn, "examples": len(golds)}


# --- the gold file ---------------------------------------------------------------------------------

def read_gold(path: Path | str) -> dict[int, Gold]:
    """The gold answers of every line of a train-format jsonl, read one line at a time (documents are
    not kept). Any bad line, a test-format line (no annotations), a repeated example_id or an empty
    file raises :class:`DataError` naming the file and line: nothing is skipped."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such gold file (it must be a train-format jsonl with annotations)")
    golds: dict[int, Gold] = {}
    lines: dict[int, int] = {}
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            try:
                example_id, targets = parse_annotations(raw)
            except BadLine as err:
                raise DataError(f"{path}:{number}: {err}. Fix the gold file: every line is scored, none is "
                                "skipped") from None
            if example_id in lines:
                raise DataError(f"{path}:{number}: example_id {example_id} repeats line {lines[example_id]}; "
                                "a gold file holds each example once")
            lines[example_id] = number
            golds[example_id] = Gold.from_targets(targets)
    if not golds:
        raise DataError(f"{path}: the gold file holds no examples (it is empty); it must be a train-format jsonl")
    return golds


# --- submission files ------------------------------------------------------------------------------

class SubmissionError(ValueError):
    """A submission file cannot be scored; the message names the file, line and row, and the fix."""


def read_submission(path: Path | str, expected_ids: Collection[int] | None = None) -> dict[int, Answer]:
    """The answers of a submission CSV, by example id in the order of their first row.

    Raises :class:`SubmissionError` on a wrong header, a row that is malformed or repeated, and, with
    ``expected_ids`` (the gold's example ids), on a row for another example or an example missing a row.
    Spaces around a prediction are ignored; ``007:10`` reads as ``7:10``. Empty lines are ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise SubmissionError(f"{path}: no such submission file")
    expected = None if expected_ids is None else set(expected_ids)
    predictions: dict[int, dict[str, str]] = {}
    lines: dict[str, int] = {}
    text = _utf8_text(path)
    try:
        with io.StringIO(text, newline="") as file:
            reader = csv.reader(file, strict=True)
            header = next(reader, None)
            if header is None:
                raise SubmissionError(f"{path}: the file is empty; a submission starts with the header "
                                      f"{','.join(HEADER)}, then two rows per example")
            if [field.strip() for field in header] != HEADER:
                raise SubmissionError(f"{path}:1: the header is {','.join(header)!r}; it must be "
                                      f"{','.join(HEADER)!r}")
            for row in reader:
                if not row:
                    continue
                where = f"{path}:{reader.line_num}: row {row[0].strip()!r}"
                if len(row) != 2:
                    raise SubmissionError(f"{where} has {len(row)} field(s); each row must be "
                                          "<example_id>_long|_short,<prediction> (2 fields)")
                row_id, value = row[0].strip(), row[1].strip()
                match = ROW_ID.match(row_id)
                if not match:
                    raise SubmissionError(f"{where}: the id is not <example_id>_long or <example_id>_short "
                                          "(the example_id an integer)")
                example_id, kind = int(match.group(1)), match.group(2)
                row_id = f"{example_id}_{kind}"
                if row_id in lines:
                    raise SubmissionError(f"{where} repeats line {lines[row_id]}; keep one row per id")
                lines[row_id] = reader.line_num
                if expected is not None and example_id not in expected:
                    raise SubmissionError(f"{where}: example {example_id} is not in the gold file; the submission "
                                          "must answer exactly the gold's examples (is it for another file?)")
                predictions.setdefault(example_id, {})[kind] = _prediction(value, kind, where)
    except csv.Error as err:
        raise SubmissionError(f"{path}:{reader.line_num}: not readable as CSV ({err})") from None
    _check_complete(path, predictions, expected_ids)
    return {i: Answer(p["long"], p["short"]) for i, p in predictions.items()}


def _utf8_text(path: Path) -> str:
    """The whole file as text (a submission is a few MB); SubmissionError naming the line that is not UTF-8."""
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SubmissionError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}: {err.reason}); "
                              "save the submission as a UTF-8 CSV") from None


def _prediction(value: str, kind: str, where: str) -> str:
    """The canonical form of one PredictionString; SubmissionError when it is not one answer."""
    if not value:
        return ""
    if value in YES_NO:
        if kind == "long":
            raise SubmissionError(f"{where}: {value} is only allowed in a _short row; a long answer is a "
                                  "start:end span or blank")
        return value
    match = SPAN.match(value)
    if match:
        start, end = int(match.group(1)), int(match.group(2))
        if start >= end:
            raise SubmissionError(f"{where}: span {value!r} has start >= end; spans are start:end token "
                                  "indices with start < end (end exclusive)")
        return f"{start}:{end}"
    parts = value.split()
    if len(parts) > 1 and all(SPAN.match(p) or p in YES_NO for p in parts):
        raise SubmissionError(f"{where}: {value!r} holds {len(parts)} answers; only one span is allowed per "
                              "row: keep the best one")
    allowed = "blank, start:end (0 <= start < end) or, in a _short row, YES or NO"
    raise SubmissionError(f"{where}: PredictionString {value!r:.40} is not {allowed}")


def _check_complete(path: Path, predictions: dict[int, dict[str, str]], expected: Collection[int] | None) -> None:
    """Every example (of ``expected``, or that has any row) needs both its _long and its _short row."""
    missing = [f"{i}_{kind}" for i in predictions for kind in ("long", "short") if kind not in predictions[i]]
    absent = [] if expected is None else [i for i in expected if i not in predictions]  # in the gold's order
    if not missing and not absent:
        return
    total = len(missing) + 2 * len(absent)
    first = (f"example {missing[0].rsplit('_', 1)[0]} has no {missing[0]} row" if missing
             else f"example {absent[0]} has no rows")
    raise SubmissionError(f"{path}: {first}; {total} row(s) are missing in all ({len(missing)} example(s) lack "
                          f"one of their two rows, {len(absent)} lack both). Write a _long and a _short row for "
                          "every example of the gold, blank when there is no answer")


def write_submission(path: Path | str, answers: Mapping[int, Answer]) -> None:
    """Header ``example_id,PredictionString``, then ``<id>_long`` and ``<id>_short`` rows in the order of
    ``answers``; written atomically (a temporary file renamed over ``path``). Answers that
    :func:`read_submission` would refuse raise ValueError and nothing is written."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(HEADER)
    for example_id, answer in answers.items():
        for kind, value in (("long", answer.long), ("short", answer.short)):
            try:
                value = _prediction(value.strip(), kind, f"answer {example_id}_{kind}")
            except SubmissionError as err:
                raise ValueError(str(err)) from None
            writer.writerow([f"{example_id}_{kind}", value])
    data = text.getvalue().encode()
    atomic_write(Path(path), lambda file: file.write(data))
