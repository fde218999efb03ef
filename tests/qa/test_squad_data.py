"""Reading data in the SQuAD schema: four forms of one content, and every malformed record named or counted."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distqa.config.errors import DataError
from distqa.qa.squad.reader import SquadExample, read_squad
from distqa.qa.squad.synthetic import as_json_lines

from support.processes import clean_env, free_port
from support.repo import REPO_ROOT

CONTEXT = "The capital of the Northern River is Zürich . It is old ."


def question(qid: str, text: str = "what is the capital of the northern river", answers: list[Any] | None = None,
             **extra: Any) -> dict[str, Any]:
    answers = [{"text": "Zürich", "answer_start": 37}] if answers is None else answers
    return {"question": text, "id": qid, "answers": answers, **extra}


def squad_document(*questions: dict[str, Any], version: str = "v2.0") -> dict[str, Any]:
    return {"version": version, "data": [{"title": "Northern River", "paragraphs": [
        {"context": CONTEXT, "qas": list(questions)}]}]}


def write_json(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document, ensure_ascii=False))
    return path


V2 = squad_document(question("a", is_impossible=False),
                    question("b", "what is the album of the northern river", answers=[], is_impossible=True),
                    question("c", "  is it old", answers=[{"text": "old", "answer_start": 52},
                                                          {"text": "old .", "answer_start": 52}], is_impossible=False))
EXPECTED = [
    SquadExample("a", "what is the capital of the northern river", CONTEXT, (("Zürich", 37),), "Northern River"),
    SquadExample("b", "what is the album of the northern river", CONTEXT, (), "Northern River"),
    SquadExample("c", "is it old", CONTEXT, (("old", 52), ("old .", 52)), "Northern River"),
]


def test_squad_json_jsonl_parquet_and_json_lines_in_a_json_file_read_the_same_questions(tmp_path: Path) -> None:
    records = list(as_json_lines(V2["data"][0]))
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    json_lines_named_json = tmp_path / "lines.json"  # what datasets.Dataset.to_json writes
    json_lines_named_json.write_text(jsonl.read_text())
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    for path in (write_json(tmp_path / "train.json", V2), jsonl, json_lines_named_json, parquet):
        read = read_squad(path)
        assert read.examples == EXPECTED, path
        assert (read.records, read.bad) == (3, 0)


def test_squad_v1_1_without_is_impossible_reads(tmp_path: Path) -> None:
    path = write_json(tmp_path / "v1.json", squad_document(question("a"), version="1.1"))
    assert read_squad(path).examples == EXPECTED[:1]


def replaced(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """V2 with the value at ``path`` (keys from the second question of the paragraph) replaced; a missing value
    (``...``) deletes it."""
    document = copy.deepcopy(V2)
    target = document["data"][0]["paragraphs"][0]
    target = target["qas"][1] if path[0] != "context" else target
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


ANSWER = [{"text": "Zürich", "answer_start": 37}]
BAD_RECORDS = {
    # case: (what changes in question b, what the message says)
    "missing id": (("id",), ..., "field 'id' is missing"),
    "numeric id": (("id",), 7, "field 'id' should be a string, got int 7"),
    "missing question": (("question",), ..., "field 'question' is missing"),
    "list question": (("question",), ["what"], "field 'question' should be a string, got list"),
    "empty question": (("question",), "  ", "field 'question' is empty"),
    "missing context": (("context",), ..., "field 'context' is missing"),
    "numeric context": (("context",), 3, "field 'context' should be a string, got int 3"),
    "missing answers": (("answers",), ..., "field 'answers' is missing"),
    "answers a string": (("answers",), "Zürich", "field 'answers' should be a list (SQuAD) or an object"),
    "answer text missing": (("answers",), [{"answer_start": 37}], "field 'answers[0].text' is missing"),
    "answer text a number": (("answers",), [{"text": 5, "answer_start": 37}],
                             "field 'answers[0].text' should be a string, got int 5"),
    "answer_start missing": (("answers",), [{"text": "Zürich"}], "field 'answers[0].answer_start' is missing"),
    "answer_start a string": (("answers",), [{"text": "Zürich", "answer_start": "37"}],
                              "field 'answers[0].answer_start' should be an integer, got str"),
    "answer_start elsewhere": (("answers",), [{"text": "Zürich", "answer_start": 36}],
                               "field 'answers[0].answer_start' is 36, which does not point at its text 'Zürich' "
                               "(the context there reads ' Züric')"),
    "answer_start past the end": (("answers",), [{"text": "Zürich", "answer_start": 400}],
                                  "is 400, which does not point at its text"),
    "impossible with an answer": (("answers",), ANSWER, "field 'is_impossible' is true but the question has 1 answer"),
    "is_impossible a string": (("is_impossible",), "yes", "field 'is_impossible' should be true or false"),
    "repeated id": (("id",), "a", "id 'a' repeats the question at "),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_each_malformed_record_is_named_by_file_question_and_field_or_skipped_and_counted(
        case: str, tmp_path: Path) -> None:
    keys, value, message = BAD_RECORDS[case]
    path = write_json(tmp_path / "train.json", replaced(keys, value))
    # A bad context spoils every question of its paragraph, the first is named; anything else only question b.
    where = "qas[0]" if "context" in case else "qas[1]"
    with pytest.raises(DataError) as failed:
        read_squad(path, on_bad_line="fail")
    assert str(failed.value).startswith(f"{path}: data[0].paragraphs[0].{where}: ") and message in str(failed.value)
    if case in ("missing context", "numeric context"):  # the paragraph's every question: none is left
        with pytest.raises(DataError, match="none of its 3 questions is usable"):
            read_squad(path, max_bad_line_fraction=1.0)
        return
    skipped = read_squad(path, max_bad_line_fraction=1.0)
    assert (skipped.records, skipped.bad, len(skipped.examples)) == (3, 1, 2)
    assert message in skipped.reports[0]


def test_too_many_bad_records_refuse_the_file_listing_the_first(tmp_path: Path) -> None:
    path = write_json(tmp_path / "train.json", replaced(("id",), 7))
    with pytest.raises(DataError, match=r"(?s)1 of 3 questions \(33.3%\) are malformed, more than "
                                        r"max_bad_line_fraction=0.01.*field 'id' should be a string"):
        read_squad(path)


def test_skipped_records_are_reported_under_the_squad_readers_logger(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The bad-fraction check is shared with the NQ reader; its warning still carries the SQuAD reader's name, the
    one a user filters on (logging's per-logger levels) and reads in the log line."""
    path = write_json(tmp_path / "train.json", replaced(("id",), 7))
    caplog.set_level("WARNING")
    read_squad(path, max_bad_line_fraction=1.0)
    skipped = [(r.name, r.levelname) for r in caplog.records
               if "skipped 1 malformed question(s) of 3" in r.getMessage()]
    assert skipped == [("distqa.qa.squad.reader", "WARNING")]


def test_the_gold_reads_only_answer_texts_and_predict_reads_no_answers(tmp_path: Path) -> None:
    shifted = write_json(tmp_path / "gold.json", replaced(("answers",), [{"text": "Zürich", "answer_start": 3}]))
    assert read_squad(shifted, "gold").examples[1].answers == (("Zürich", -1),)
    no_answers = write_json(tmp_path / "test.json", replaced(("answers",), ...))
    assert [e.answers for e in read_squad(no_answers, "ignore").examples] == [(), (), ()]


def test_bytes_that_are_not_utf8_are_named_by_line(tmp_path: Path) -> None:
    whole = tmp_path / "train.json"
    text = json.dumps(V2, indent=1).encode()
    whole.write_bytes(text.replace(b'"Northern River"', b'"North\xe9rn"', 1))
    line = text[:text.index(b'"Northern River"')].count(b"\n") + 1
    with pytest.raises(DataError, match=rf"^{whole}:{line}: not UTF-8 text: byte 0xe9 at column 19 "):
        read_squad(whole)
    lines = tmp_path / "train.jsonl"
    records = [json.dumps(r).encode() for r in as_json_lines(V2["data"][0])]
    lines.write_bytes(b"\n".join([records[0], "Zürich".encode("latin-1"), records[2]]) + b"\n")
    with pytest.raises(DataError, match=rf"^{lines}:2: not UTF-8 text: byte 0xfc at column 2"):
        read_squad(lines, on_bad_line="fail")
    assert read_squad(lines, max_bad_line_fraction=0.5).bad == 1


JSON_LINES_CASES = {
    "truncated line": ('{"id": "b", "question": "wh', "not valid JSON"),
    "a list": ("[1, 2]", "expected a JSON object, got list"),
    "lists of different lengths": (json.dumps({"id": "b", "question": "q", "context": CONTEXT,
                                               "answers": {"text": ["Zürich"], "answer_start": []}}),
                                   "field 'answers' has 1 texts but 0 answer_starts"),
    "no answer texts": (json.dumps({"id": "b", "question": "q", "context": CONTEXT, "answers": {"answer_start": [3]}}),
                        "field 'answers.text' is missing"),
    "a Hugging Face answer_start elsewhere": (
        json.dumps({"id": "b", "question": "q", "context": CONTEXT,
                    "answers": {"text": ["Zürich"], "answer_start": [2]}}),
        "field 'answers.answer_start[0]' is 2, which does not point at its text"),
}


@pytest.mark.parametrize("case", list(JSON_LINES_CASES))
def test_a_bad_json_line_is_named_by_file_and_line(case: str, tmp_path: Path) -> None:
    line, message = JSON_LINES_CASES[case]
    records = [json.dumps(r) for r in as_json_lines(V2["data"][0])]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join([records[0], line, records[2]]) + "\n")
    with pytest.raises(DataError) as failed:
        read_squad(path, on_bad_line="fail")
    assert str(failed.value).startswith(f"{path}:2: ") and message in str(failed.value), str(failed.value)


WHOLE_FILE_CASES = {
    "not JSON": ('{"version": "v2.0", "data": [', "not valid JSON"),
    "a list": ("[]", "not a SQuAD file: expected an object with a 'data' list"),
    "no data": ('{"version": "v2.0"}', "got an object with keys ['version']"),
    "empty data": ('{"version": "v2.0", "data": []}', "holds no questions"),
    "an article without paragraphs": ('{"data": [{"title": "x"}]}', "data[0]: should be an object with a 'paragraphs'"),
}


@pytest.mark.parametrize("case", list(WHOLE_FILE_CASES))
def test_a_file_that_is_not_squad_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    text, message = WHOLE_FILE_CASES[case]
    path = tmp_path / "train.json"
    path.write_text(text)
    with pytest.raises(DataError, match=re.escape(message)):
        read_squad(path, on_bad_line="skip", max_bad_line_fraction=1.0)


def test_a_missing_file_or_a_bad_hub_name_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"squad_validation_file: {tmp_path / 'dev.json'} is not a file"):
        read_squad(tmp_path / "dev.json", setting="squad_validation_file")
    with pytest.raises(DataError, match="write a Hugging Face dataset as hf:NAME:SPLIT"):
        read_squad("hf:squad_v2")


def test_an_unreachable_hub_dataset_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Offline (HF_HUB_OFFLINE=1) with an empty HF_HOME: what a machine without the hub sees. Fetching a real dataset
    cannot be tested here (no network)."""
    result = subprocess.run(
        [sys.executable, "-m", "distqa.prepare", "--task", "squad", "--squad-train-file", "hf:rajpurkar/squad_v2:train",
         "--squad-cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, env=clean_env(HF_HOME=str(tmp_path / "hf")), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("distqa.prepare: error: squad_train_file: cannot load the Hugging Face dataset "
                           "'rajpurkar/squad_v2', split 'train'") and "HF_HUB_OFFLINE=1" in last, result.stderr


def test_a_hub_dataset_without_the_hub_or_the_flag_is_one_line_at_once(tmp_path: Path) -> None:
    """No HF_HUB_OFFLINE, and the hub a closed loopback port (a machine without network): one request, then one line
    naming the dataset, HF_HOME and what to do, with no retries (datasets' own load retried for half a minute)."""
    env = clean_env(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    env["HF_HUB_OFFLINE"] = "0"  # clean_env sets it to 1
    result = subprocess.run(
        [sys.executable, "-m", "distqa.prepare", "--task", "squad", "--squad-train-file", "hf:rajpurkar/squad_v2:train",
         "--squad-cache-dir", str(tmp_path / "cache")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "distqa.prepare: error: squad_train_file: the Hugging Face dataset 'rajpurkar/squad_v2' is not in the "
        f"datasets cache {tmp_path / 'hf' / 'datasets'} (HF_HOME={tmp_path / 'hf'}), and the hub "
        f"{env['HF_ENDPOINT']} cannot be reached (ConnectError: [Errno 111] Connection refused). Load it once with "
        "network into the same HF_HOME (python -m distqa.prepare with these settings does), or save it as a .jsonl "
        "or .parquet file and give that path."], result.stderr
