"""Data in the SQuAD schema, read and checked record by record into :class:`SquadExample` s.

One schema, four forms:

- SQuAD v1.1 / v2.0 JSON (``train-v2.0.json``, ``dev-v2.0.json``; ``is_impossible`` only in v2)::

      {"version": "v2.0", "data": [{"title": "...", "paragraphs": [{"context": "...", "qas": [
          {"id": "...", "question": "...", "answers": [{"text": "...", "answer_start": 42}],
           "is_impossible": false}]}]}]}

- JSON Lines (``.jsonl``, or a ``.json`` with one object per line, as ``datasets.Dataset.to_json`` writes it) and
  Parquet (``.parquet``) in the Hugging Face ``datasets`` squad schema, one question per record::

      {"id": "...", "title": "...", "context": "...", "question": "...",
       "answers": {"text": ["..."], "answer_start": [42]}}

- ``hf:NAME:SPLIT``, a Hugging Face dataset in that schema (``hf:rajpurkar/squad_v2:validation``), loaded by
  ``datasets.load_dataset`` into ``HF_HOME``. ``python -m distqa.prepare`` (one process, before any rank starts)
  is what loads it; the ranks read only the feature cache built from it.

A question without answers is unanswerable (SQuAD v2). Every record is checked before it is used; a bad one
raises :class:`BadRecord` naming the field, and :func:`read_squad` reports it as ``where: reason`` under the
skip-and-count or fail-fast policy (``on_bad_line``), as the NQ reader does: a missing or non-string field, an
``answer_start`` that does not point at its text, an id seen before, bytes that are not UTF-8.

How much of the answers is checked (:data:`AnswerCheck`): ``"train"``, every answer with its offset (the labels
come from it); ``"gold"``, only the texts, which is all the official evaluation reads; ``"ignore"``, nothing
(predict's input may hold no answers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from distqa.config import resolve_path
from distqa.config.errors import DataError
from distqa.encoders.hub import hf_home, hub_offline, hub_unreachable
from distqa.qa.bad_records import BadLinePolicy, check_bad_fraction, report_bad

log = logging.getLogger(__name__)

AnswerCheck = Literal["train", "gold", "ignore"]
HUB_PREFIX = "hf:"
_MISSING = object()


class BadRecord(ValueError):  # noqa: N818 - reads as "raise BadRecord(reason)"
    """One record (question) is malformed; the message names the field at fault."""


@dataclass(frozen=True)
class SquadExample:
    id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...] = ()
    """(text, answer_start) of each gold answer; empty: unanswerable. answer_start is -1 where unchecked."""
    title: str = ""


@dataclass
class SquadRecords:
    """The good records of one source, and what was wrong with the others."""

    source: str
    examples: list[SquadExample]
    records: int
    bad: int = 0
    reports: list[str] = field(default_factory=list)
    """The first few bad records as "where: reason"."""


def hub_name(spec: str) -> tuple[str, str] | None:
    """(dataset name, split) of an ``hf:NAME:SPLIT`` source; None for a file."""
    if not spec.startswith(HUB_PREFIX):
        return None
    name, colon, split = spec[len(HUB_PREFIX):].rpartition(":")
    if not (colon and name and split):
        raise DataError(f"{spec!r}: write a Hugging Face dataset as hf:NAME:SPLIT, e.g. hf:rajpurkar/squad_v2:train.")
    return name, split


def source_path(spec: str, setting: str) -> Path:
    """The existing file ``spec`` names (relative to here or to the repository); a DataError naming ``setting``."""
    path = resolve_path(spec)
    if not path.is_file():
        raise DataError(f"{setting}: {spec} is not a file. Give a SQuAD .json, a .jsonl or .parquet in the Hugging "
                        "Face squad schema, or hf:NAME:SPLIT; `python -m distqa.qa.squad.synthetic` writes a "
                        "sample (docs/SQUAD.md).")
    return path


def read_squad(spec: str | Path, answers: AnswerCheck = "train", on_bad_line: BadLinePolicy = "skip",
               max_bad_line_fraction: float = 0.01, setting: str = "squad_train_file",
               fix: str = "Fix or remove the record.") -> SquadRecords:
    """Every good question of ``spec`` (a file or ``hf:NAME:SPLIT``), in order; bad ones skipped and counted or,
    with ``on_bad_line='fail'``, the first one a BadRecordError ending with ``fix``, what to do about it (the commands
    that can skip add how: :class:`~distqa.config.errors.BadRecordError`). Past ``max_bad_line_fraction`` the source is
    refused."""
    spec = str(spec)
    hub = hub_name(spec)
    records = _hub_records(*hub, spec, setting) if hub else _file_records(source_path(spec, setting))
    result = SquadRecords(spec, [], 0)
    first_seen: dict[str, str] = {}
    for where, record in records:
        result.records += 1
        try:
            if isinstance(record, BadRecord):
                raise record
            example = _example(record, answers)
            if example.id in first_seen:
                raise BadRecord(f"id {example.id!r} repeats the question at {first_seen[example.id]}; ids must be "
                                "unique (predictions and scores are keyed by them)")
        except BadRecord as err:
            result.bad += 1
            report_bad(f"{where}: {err}", f". {fix}", on_bad_line, result.reports)
            continue
        first_seen[example.id] = where
        result.examples.append(example)
    check_bad_fraction(result.source, total=result.records, usable=len(result.examples), bad=result.bad,
                       reports=result.reports, limit=max_bad_line_fraction, unit="question", empty="holds no questions",
                       logger=log)
    return result


# --- the forms --------------------------------------------------------------------------------------

Records = Iterator[tuple[str, "dict[str, Any] | BadRecord"]]
"""(where, a flat record in the Hugging Face schema or what is wrong with it) per question."""


def _file_records(path: Path) -> Records:
    if path.suffix == ".parquet":
        return _parquet_records(path)
    if path.suffix in (".jsonl", ".ndjson"):
        return _json_lines(path)
    raw = path.read_bytes()
    text = _decoded(raw, path)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # a second value after the first: one record per line (datasets' to_json)
            return _json_lines(path)
        raise DataError(f"{path}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}; is the file truncated?") from None
    if not (isinstance(document, dict) and isinstance(document.get("data"), list)):
        got = f"an object with keys {sorted(document)[:5]}" if isinstance(document, dict) else type(document).__name__
        raise DataError(f"{path}: not a SQuAD file: expected an object with a 'data' list (SQuAD v1.1/v2.0), got "
                        f"{got}. A file of one question per line is JSON Lines (.jsonl, the Hugging Face schema).")
    return _squad_records(document["data"], path)


def _decoded(raw: bytes, path: Path, line: int = 0) -> str:
    try:
        return raw.decode("utf-8-sig")  # -sig: a BOM that an editor put at the start
    except UnicodeDecodeError as err:
        row = line or raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        message = (f"not UTF-8 text: byte 0x{raw[err.start]:02x} at column {column} ({err.reason}); SQuAD files are "
                   "UTF-8 JSON: is the file in another encoding, or corrupted?")
        if line:
            raise BadRecord(message) from None
        raise DataError(f"{path}:{row}: {message}") from None


def _squad_records(articles: list[Any], path: Path) -> Records:
    """SQuAD's nesting (articles > paragraphs > questions) flattened into the Hugging Face schema."""
    for a, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            yield f"{path}: data[{a}]", BadRecord("should be an object with a 'paragraphs' list")
            continue
        title = article.get("title", "")
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                yield where, BadRecord("should be an object with a 'qas' list")
                continue
            for q, question in enumerate(paragraph["qas"]):
                if not isinstance(question, dict):
                    yield f"{where}.qas[{q}]", BadRecord(f"should be an object, got {type(question).__name__}")
                    continue
                yield f"{where}.qas[{q}]", {**question, "title": title,
                                            "context": paragraph.get("context", _MISSING)}


def _json_lines(path: Path) -> Records:
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(_decoded(raw, path, number).rstrip("\r\n"))
            except BadRecord as err:
                yield where, err
                continue
            except json.JSONDecodeError as err:
                yield where, BadRecord(f"not valid JSON: {err.msg} (column {err.colno}); is the line truncated?")
                continue
            yield where, record if isinstance(record, dict) else BadRecord(
                f"expected a JSON object, got {type(record).__name__}")


def _parquet_records(path: Path) -> Records:
    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable Parquet file ({type(err).__name__}: {err}).") from None
    for index, row in enumerate(rows):
        yield f"{path}: row {index} (from 0)", row


def _hub_records(name: str, split: str, spec: str, setting: str) -> Records:
    # Here, not at the top: `datasets` takes a second or two to import, and only a hub source needs it.
    import datasets

    # datasets itself retries an unreachable hub for half a minute before it looks into its cache (load.py,
    # dataset_module_factory): one request first, and where nothing answers, its cache (CachedDatasetModuleFactory,
    # what it reads offline) or one line at once.
    unreachable = None if hub_offline() else hub_unreachable(name, "dataset")
    if unreachable and not _in_datasets_cache(name):
        raise DataError(f"{setting}: the Hugging Face dataset {name!r} is not in the datasets cache "
                        f"{datasets.config.HF_DATASETS_CACHE} (HF_HOME={hf_home()}), and {unreachable}. Load it once "
                        "with network into the same HF_HOME (python -m distqa.prepare with these settings does), or "
                        "save it as a .jsonl or .parquet file and give that path.")
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as err:  # the hub and datasets fail in many types; what to do is the same
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"{setting}: cannot load the Hugging Face dataset {name!r}, split {split!r} ({message}). "
                        f"Offline (HF_HUB_OFFLINE=1) it must already be in the datasets cache under HF_HOME "
                        f"({datasets.config.HF_DATASETS_CACHE}), loaded there once with network; or save it as a "
                        ".jsonl or .parquet file and give that path.") from None
    for index, row in enumerate(dataset):
        yield f"{spec}: row {index} (from 0)", row


def _in_datasets_cache(name: str) -> bool:
    """Whether ``datasets`` has ``name`` prepared in its cache, as it looks offline."""
    from datasets.load import CachedDatasetModuleFactory  # with `datasets`, imported only for a hub source

    try:
        CachedDatasetModuleFactory(name).get_module()
    except FileNotFoundError:
        return False
    return True


# --- one record --------------------------------------------------------------------------------------

def _example(record: dict[str, Any], check: AnswerCheck) -> SquadExample:
    example_id = _field(record, "id")
    question, context = _field(record, "question").lstrip(), _field(record, "context")
    for name, value in (("id", example_id), ("question", question), ("context", context)):
        if not value.strip():
            raise BadRecord(f"field '{name}' is empty")
    title = record.get("title", "")
    if not isinstance(title, str):
        raise BadRecord(f"field 'title' should be a string, got {type(title).__name__} {title!r:.40}")
    answers = () if check == "ignore" else _answers(record, context, check)
    return SquadExample(example_id, question, context, answers, title)


def _field(record: dict[str, Any], name: str, kind: type = str, where: str = "") -> Any:
    """``record[name]``, a string (or a ``kind``); a BadRecord naming the field (``where`` its parent) otherwise."""
    value = record.get(name, _MISSING)
    if value is _MISSING:
        raise BadRecord(f"field '{where}{name}' is missing")
    if not isinstance(value, kind):
        shown = f" {value!r:.40}" if kind is str else ""
        raise BadRecord(f"field '{where}{name}' should be a {'string' if kind is str else kind.__name__}, got "
                        f"{type(value).__name__}{shown}")
    return value


def _answers(record: dict[str, Any], context: str, check: AnswerCheck) -> tuple[tuple[str, int], ...]:
    value = record.get("answers", _MISSING)
    if value is _MISSING:
        raise BadRecord("field 'answers' is missing (an unanswerable question has an empty one)")
    if isinstance(value, dict):  # the Hugging Face schema: parallel lists
        texts = _field(value, "text", list, "answers.")
        starts = _field(value, "answer_start", list, "answers.") if check == "train" else [-1] * len(texts)
        if len(starts) != len(texts):
            raise BadRecord(f"field 'answers' has {len(texts)} texts but {len(starts)} answer_starts")
        found, where = list(zip(texts, starts, strict=True)), "answers.{0}[{1}]"
    elif isinstance(value, list):  # SQuAD's: a list of objects
        found, where = [], "answers[{1}].{0}"
        for i, answer in enumerate(value):
            if not isinstance(answer, dict):
                raise BadRecord(f"field 'answers[{i}]' should be an object, got {type(answer).__name__}")
            found.append((answer.get("text", _MISSING),
                          answer.get("answer_start", _MISSING) if check == "train" else -1))
    else:
        raise BadRecord(f"field 'answers' should be a list (SQuAD) or an object of lists text and answer_start "
                        f"(Hugging Face), got {type(value).__name__}")
    answers = tuple(_answer(text, start, where, i, context, check) for i, (text, start) in enumerate(found))
    impossible = record.get("is_impossible", _MISSING)
    if impossible is not _MISSING and check == "train":
        if not isinstance(impossible, bool):
            raise BadRecord(f"field 'is_impossible' should be true or false, got {impossible!r:.40}")
        if impossible == bool(answers):
            raise BadRecord(f"field 'is_impossible' is {str(impossible).lower()} but the question has "
                            f"{len(answers)} answer(s)")
    return answers


def _answer(text: Any, start: Any, where: str, index: int, context: str, check: AnswerCheck) -> tuple[str, int]:
    """One answer, checked; ``where.format(field, index)`` names its fields in messages."""
    if not isinstance(text, str):
        text_at = where.format("text", index)
        if text is _MISSING:
            raise BadRecord(f"field '{text_at}' is missing")
        raise BadRecord(f"field '{text_at}' should be a string, got {type(text).__name__} {text!r:.40}")
    if check != "train":
        return text, -1
    if type(start) is int and start >= 0 and context[start:start + len(text)] == text and text.strip():
        return text, start  # the common case, checked at once
    start_at = where.format("answer_start", index)
    if not text.strip():
        raise BadRecord(f"field '{where.format('text', index)}' is empty")
    if start is _MISSING:
        raise BadRecord(f"field '{start_at}' is missing")
    if not isinstance(start, int) or isinstance(start, bool):
        raise BadRecord(f"field '{start_at}' should be an integer, got {type(start).__name__} {start!r:.40}")
    there = context[start:start + len(text)] if start >= 0 else ""
    raise BadRecord(f"field '{start_at}' is {start}, which does not point at its text {text!r:.60} (the context "
                    f"there reads {there!r:.60}); answer_start is the character index of the answer in the context, "
                    "from 0")
