"""Natural Questions (Kaggle "simplified" jsonl): validated streaming reader and answer targets.

One JSON object per line; ``document_text`` is whitespace-tokenised and every offset counts those
tokens, start inclusive and end exclusive::

    {"example_id": 5655493461695504401, "question_text": "...", "document_text": "<H1> Email ... </P>",
     "long_answer_candidates": [{"start_token": 14, "end_token": 170, "top_level": true}, ...],
     "annotations": [{"yes_no_answer": "NONE" | "YES" | "NO",
                      "long_answer": {"start_token": 14, "end_token": 170, "candidate_index": 0},
                      "short_answers": [{"start_token": 31, "end_token": 33}, ...]}]}

The test file has no ``annotations``. Every line is checked before it is used; a bad line raises
:class:`BadLine` with the field at fault, and :func:`scan` turns that into "file:line: reason"
under the skip-and-count or fail-fast policy. Nothing here holds more than one line of the file.

Targets follow the Kaggle competition: the answer type is YES/NO when ``yes_no_answer`` says so,
else SHORT when there are short spans (all of them are kept, not only the first), else LONG when
there is a long answer, else UNKNOWN. Training uses only the first annotation (the Kaggle train file has
exactly one per example); :func:`parse_annotations` reads all of them, for scoring (NQ dev has five).
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distqa.config.errors import DataError
from distqa.qa.answers import AnswerType, Span
from distqa.qa.bad_records import BadLinePolicy, check_bad_fraction, report_bad

log = logging.getLogger(__name__)


class BadLine(ValueError):  # noqa: N818 - reads as "raise BadLine(reason)"
    """One line of the input is malformed; the message names the field at fault."""


@dataclass(frozen=True)
class Targets:
    """What one annotation says (training uses the first). ``long`` is None when there is no long answer."""

    answer_type: AnswerType
    long: Span | None = None
    long_candidate: int = -1
    short: tuple[Span, ...] = ()

    @property
    def label_spans(self) -> tuple[Span, ...]:
        """The spans a window may be labelled with: every short span, else the long answer (also
        for YES/NO, whose evidence is the long answer), else none."""
        if self.answer_type == AnswerType.SHORT:
            return self.short
        return (self.long,) if self.long is not None else ()


@dataclass(frozen=True)
class NQExample:
    example_id: int
    question: str
    document: str
    num_tokens: int
    candidates: np.ndarray = field(repr=False)
    """int32 (n, 3): start_token, end_token, top_level of every long-answer candidate."""
    targets: Targets | None = None
    """None for unlabelled (test) examples."""


def parse_example(raw: bytes | str, labelled: bool) -> NQExample:
    """Decode and check one line; raises :class:`BadLine` naming the first field that is wrong."""
    record = _decode(raw)
    example_id = _example_id(record)
    question = _get(record, "question_text", str)
    document = _get(record, "document_text", str)
    num_tokens = document.count(" ") + 1
    candidates = _candidates(_get(record, "long_answer_candidates", list), num_tokens)
    targets = None
    if labelled:
        annotations = _get(record, "annotations", list)
        if not annotations:
            raise BadLine("field 'annotations' is empty; training needs one annotation per example "
                          "(the test file has none: use the train file)")
        targets = _targets(annotations[0], candidates, num_tokens)
    return NQExample(example_id, question, document, num_tokens, candidates, targets)


def parse_annotations(raw: bytes | str) -> tuple[int, list[Targets]]:
    """The example_id and the targets of *every* annotation of one train-format line (for scoring).

    The fields the answers depend on (example_id, document_text for its length, long_answer_candidates,
    annotations) get the same checks as in :func:`parse_example`; the document is not kept. Raises
    :class:`BadLine` naming the field at fault, e.g. ``annotations[3].short_answers[0]``."""
    record = _decode(raw)
    example_id = _example_id(record)
    num_tokens = _get(record, "document_text", str).count(" ") + 1
    candidates = _candidates(_get(record, "long_answer_candidates", list), num_tokens)
    if "annotations" not in record:
        raise BadLine("field 'annotations' is missing; this looks like the test file, which has no answers: "
                      "a gold file must be in the train format (the same examples with their annotations)")
    annotations = _get(record, "annotations", list)
    if not annotations:
        raise BadLine("field 'annotations' is empty; every example needs at least one annotation "
                      "(an unanswered one has long_answer.candidate_index -1)")
    return example_id, [_targets(a, candidates, num_tokens, i) for i, a in enumerate(annotations)]


def _decode(raw: bytes | str) -> dict[str, Any]:
    if isinstance(raw, bytes):
        # Decoded here rather than by json.loads, which guesses UTF-16/32 from leading NULs and then
        # either raises UnicodeDecodeError or, worse, accepts a line that is not in NQ's encoding.
        try:
            raw = raw.decode("utf-8-sig")  # -sig: a BOM that an editor put before the first line
        except UnicodeDecodeError as err:
            raise BadLine(f"not UTF-8 text: byte 0x{raw[err.start]:02x} at column {err.start + 1} "
                          f"({err.reason}); NQ files are UTF-8 JSON lines: is the file in another encoding, "
                          "or corrupted?") from None
    if "\x00" in raw:  # JSON text never holds a raw NUL; a line of binary junk would read as "not valid JSON"
        raise BadLine(f"holds a NUL byte at column {raw.index(chr(0)) + 1}: not a line of JSON text; is the file "
                      "corrupted, or not an NQ jsonl?")
    try:
        # Without its newline, a truncated line reads as "unterminated string", not "control character".
        record = json.loads(raw.rstrip("\r\n"))
    except json.JSONDecodeError as err:
        raise BadLine(f"not valid JSON: {err.msg} (column {err.colno}); is the line truncated?") from None
    if not isinstance(record, dict):
        raise BadLine(f"expected a JSON object, got {type(record).__name__}")
    return record


# --- field checks ------------------------------------------------------------------------------

_MISSING = object()


def _get(record: dict[str, Any], name: str, kind: type, where: str = "") -> Any:
    value = record.get(name, _MISSING)
    path = f"{where}{name}"
    if value is _MISSING:
        hint = "; this looks like the test file, which has no answers" if name == "annotations" else ""
        raise BadLine(f"field '{path}' is missing{hint}")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadLine(f"field '{path}' should be {kind.__name__}, got {type(value).__name__} {value!r:.40}")
    return value


def _example_id(record: dict[str, Any]) -> int:
    value = record.get("example_id", _MISSING)
    if isinstance(value, str) and value.lstrip("-").isdigit():  # some NQ exports quote the id
        value = int(value)
    if value is _MISSING:
        raise BadLine("field 'example_id' is missing")
    if not isinstance(value, int) or isinstance(value, bool) or not -2**63 <= value < 2**63:
        raise BadLine(f"field 'example_id' should be a 64-bit integer, got {value!r:.40}")
    return value


def _span(record: Any, where: str, num_tokens: int) -> Span:
    if not isinstance(record, dict):
        raise BadLine(f"field '{where}' should be an object, got {type(record).__name__}")
    start = _get(record, "start_token", int, where + ".")
    end = _get(record, "end_token", int, where + ".")
    if not 0 <= start < end <= num_tokens:
        raise BadLine(f"field '{where}': span [{start}, {end}) is not inside the document's {num_tokens} "
                      "tokens with start < end (offsets are start-inclusive, end-exclusive)")
    return Span(start, end)


def _candidates(records: list[Any], num_tokens: int) -> np.ndarray:
    """int32 (n, 3) start, end, top_level; checked in bulk (documents have hundreds of candidates),
    and one by one only to name the first bad candidate."""
    try:
        rows = [(r["start_token"], r["end_token"], r.get("top_level", True)) for r in records]
        if all(type(start) is int and type(end) is int and type(top) is bool for start, end, top in rows):
            array = np.array(rows, dtype=np.int64).reshape(-1, 3)
            if ((array[:, 0] >= 0) & (array[:, 0] < array[:, 1]) & (array[:, 1] <= num_tokens)).all():
                return array.astype(np.int32)
    except (TypeError, KeyError, AttributeError, OverflowError):
        pass
    return _checked_candidates(records, num_tokens)


def _checked_candidates(records: list[Any], num_tokens: int) -> np.ndarray:
    rows = np.empty((len(records), 3), dtype=np.int32)
    for i, record in enumerate(records):
        where = f"long_answer_candidates[{i}]"
        span = _span(record, where, num_tokens)
        top_level = record.get("top_level", True)
        if not isinstance(top_level, bool):
            raise BadLine(f"field '{where}.top_level' should be true or false, got {top_level!r:.40}")
        rows[i] = span.start, span.end, top_level
    return rows


def _targets(annotation: Any, candidates: np.ndarray, num_tokens: int, index: int = 0) -> Targets:
    """The targets of ``annotations[index]`` (``index`` only names the field in messages)."""
    if not isinstance(annotation, dict):
        raise BadLine(f"field 'annotations[{index}]' should be an object, got {type(annotation).__name__}")
    where = f"annotations[{index}]."
    yes_no = _get(annotation, "yes_no_answer", str, where)
    if yes_no not in ("NONE", "YES", "NO"):
        raise BadLine(f"field '{where}yes_no_answer' should be NONE, YES or NO, got {yes_no!r:.40}")
    long_record = _get(annotation, "long_answer", dict, where)
    candidate = _get(long_record, "candidate_index", int, where + "long_answer.")
    long, long_candidate = None, -1
    if candidate >= 0:
        if candidate >= len(candidates):
            raise BadLine(f"field '{where}long_answer.candidate_index' is {candidate} but the example has "
                          f"{len(candidates)} long_answer_candidates")
        long = _span(long_record, where + "long_answer", num_tokens)
        if (long.start, long.end) != tuple(candidates[candidate, :2]):
            raise BadLine(f"field '{where}long_answer': span [{long.start}, {long.end}) differs from "
                          f"candidate {candidate} [{candidates[candidate, 0]}, {candidates[candidate, 1]})")
        long_candidate = candidate
    elif candidate != -1:
        raise BadLine(f"field '{where}long_answer.candidate_index' is {candidate}; use -1 for no answer")
    short = tuple(_span(s, f"{where}short_answers[{i}]", num_tokens)
                  for i, s in enumerate(_get(annotation, "short_answers", list, where)))
    answer_type = AnswerType.of_annotation(yes_no, has_short=bool(short), has_long=long is not None)
    if answer_type != AnswerType.UNKNOWN and long is None:
        raise BadLine(f"annotation gives a {answer_type.name} answer but no long answer "
                      f"(field '{where}long_answer.candidate_index' is -1)")
    return Targets(answer_type, long, long_candidate, short)


# --- scanning a file ---------------------------------------------------------------------------

@dataclass
class ScanResult:
    """Where the good lines of a file are, and what was wrong with the others."""

    path: Path
    lines: np.ndarray
    """1-based line numbers of the good lines."""
    offsets: np.ndarray
    """Byte offset of each good line (for reading it again with one seek)."""
    lengths: np.ndarray
    example_ids: np.ndarray
    answer_types: np.ndarray
    """AnswerType of each good line; -1 when the file is unlabelled."""
    total_lines: int = 0
    bad_lines: int = 0
    bad_reports: list[str] = field(default_factory=list)
    """The first few bad lines as "file:line: reason"."""

    def __len__(self) -> int:
        return len(self.lines)


def require_file(path: Path | str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file. Generate a sample with `python -m distqa.qa.nq.synthetic` "
                        "or download the real data (scripts/download_nq.sh, see data/README.md).")
    return path


def scan(path: Path, labelled: bool, on_bad_line: BadLinePolicy = "skip",
         max_bad_line_fraction: float = 0.01) -> ScanResult:
    """Check every line of ``path`` without keeping any; return where the good ones are.

    Bad lines are skipped and counted (the first few are reported) or, with ``on_bad_line='fail'``,
    the first one raises. Past ``max_bad_line_fraction`` bad lines the file is refused: a file
    that is mostly broken is the wrong file, not noise.
    """
    path = require_file(path)
    # 8 bytes per value, as numpy will hold them (a Python list of ints costs ~5×)
    lines, offsets, lengths, ids, types = (array("q") for _ in range(5))
    total = bad = 0
    reports: list[str] = []
    offset = 0
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            size = len(raw)
            if raw.strip():
                total += 1
                try:
                    example = parse_example(raw, labelled)
                except BadLine as err:
                    bad += 1
                    report_bad(f"{path}:{number}: {err}", "\nFix or remove the line.", on_bad_line, reports)
                else:
                    lines.append(number)
                    offsets.append(offset)
                    lengths.append(size)
                    ids.append(example.example_id)
                    types.append(example.targets.answer_type if example.targets else -1)
            offset += size
    columns = (np.array(column, dtype=np.int64) for column in (lines, offsets, lengths, ids, types))
    result = ScanResult(path, *columns, total, bad, reports)
    _drop_repeated_ids(result, on_bad_line)
    check_bad_fraction(result.path, total=result.total_lines, usable=len(result), bad=result.bad_lines,
                       reports=result.bad_reports, limit=max_bad_line_fraction, logger=log)
    return result


def _drop_repeated_ids(result: ScanResult, on_bad_line: BadLinePolicy) -> None:
    """Predictions and scores are keyed by example_id, so a second line with the same id is bad."""
    _, first = np.unique(result.example_ids, return_index=True)
    if len(first) == len(result):
        return
    keep = np.zeros(len(result), dtype=bool)
    keep[first] = True
    first_line = dict(zip(result.example_ids[first].tolist(), result.lines[first].tolist(), strict=True))
    for line, example_id in zip(result.lines[~keep].tolist(), result.example_ids[~keep].tolist(), strict=True):
        report_bad(f"{result.path}:{line}: example_id {example_id} repeats line {first_line[example_id]}",
                   "\nRemove the duplicate.", on_bad_line, result.bad_reports)
    result.bad_lines += int((~keep).sum())
    for name in ("lines", "offsets", "lengths", "example_ids", "answer_types"):
        setattr(result, name, getattr(result, name)[keep])


def read_lines(path: Path, offsets: np.ndarray, lengths: np.ndarray) -> Iterator[bytes]:
    """The raw lines at the given byte offsets (as recorded by :func:`scan`), in the given order."""
    with Path(path).open("rb") as file:
        for offset, length in zip(offsets.tolist(), lengths.tolist(), strict=True):
            file.seek(offset)
            yield file.read(length)
