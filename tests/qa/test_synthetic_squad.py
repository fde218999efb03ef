"""Synthetic SQuAD: valid SQuAD v2.0 files of the task its module describes, reproducible byte for byte."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from distqa.qa.squad.metric import normalize_answer
from distqa.qa.squad.reader import read_squad
from distqa.qa.squad.synthetic import as_json_lines, main, make_article, write

from support.processes import clean_env
from support.repo import REPO_ROOT

SAMPLE = REPO_ROOT / "data" / "squad-sample"
LEARNABLE = {"facts": 1, "plausible": 0.0, "filler_words": 10}
"""The difficulty of scripts/train_synthetic_squad.sh's set."""


def test_the_committed_sample_regenerates_byte_identically(tmp_path: Path) -> None:
    subprocess.run([str(REPO_ROOT / "scripts" / "make_squad_sample.sh"), str(tmp_path)], check=True,
                   capture_output=True, text=True, env=clean_env(), timeout=120)
    for name in ("train.json", "dev.json"):
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), (
            f"{SAMPLE / name} differs from what scripts/make_squad_sample.sh writes: run it and commit")


def test_every_question_is_valid_squad_v2_and_a_third_are_unanswerable() -> None:
    read = read_squad(SAMPLE / "train.json", on_bad_line="fail")  # every answer_start points at its text
    document = json.loads((SAMPLE / "train.json").read_text())
    assert document["version"] == "v2.0" and read.records == len(read.examples) == 365
    questions = [qa for a in document["data"] for p in a["paragraphs"] for qa in p["qas"]]
    assert all(qa["is_impossible"] == (not qa["answers"]) for qa in questions)
    assert 0.25 < sum(qa["is_impossible"] for qa in questions) / len(questions) < 0.42
    assert len({e.id for e in read.examples}) == len(read.examples)


def test_a_question_is_answered_by_exactly_its_entity_and_attribute() -> None:
    """The fact "The <attribute> of the <Entity> is <value> ." answers "what is the <attribute> of the <entity>"; an
    unanswerable question's pair is stated nowhere in its paragraph, though its words are (the other entity's
    attribute, or this entity's other attribute)."""
    for index in range(30):
        for paragraph in make_article(5, index)["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                attribute, entity = qa["question"].removeprefix("what is the ").split(" of the ")
                fact = f"The {attribute} of the {entity.title()} is "
                if qa["answers"]:
                    answer = qa["answers"][0]
                    assert context.count(fact) == 1
                    assert context.index(fact) + len(fact) == answer["answer_start"]
                    assert context[answer["answer_start"]:].startswith(answer["text"] + " .")
                else:
                    assert fact not in context
                    assert f"The {attribute} of the " in context or f"of the {entity.title()} is" in context


def test_json_lines_hold_the_same_questions_in_the_hugging_face_schema(tmp_path: Path) -> None:
    write(tmp_path / "a.json", 4, seed=2)
    write(tmp_path / "a.jsonl", 4, seed=2)
    assert read_squad(tmp_path / "a.json").examples == read_squad(tmp_path / "a.jsonl").examples
    record = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert list(record) == ["id", "title", "context", "question", "answers"]
    assert list(record["answers"]) == ["text", "answer_start"]
    assert [next(as_json_lines(make_article(2, 0)))] == [record]


def test_the_command_line_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--output", str(tmp_path / "x.json"), "--articles", "0"])
    assert "need --articles, --paragraphs, --facts >= 1" in capsys.readouterr().err
    assert main(["--output", str(tmp_path / "x.json"), "--articles", "2", "--unanswerable", "0"]) == 0
    assert "0 unanswerable" in capsys.readouterr().err


def test_the_difficulty_options() -> None:
    articles = [make_article(7, i, facts=1, plausible=0.0, unanswerable=0.5, filler_words=5) for i in range(20)]
    paragraphs = [p for a in articles for p in a["paragraphs"]]
    assert all(p["context"].count(" of the ") == 1 for p in paragraphs)  # one fact each
    assert max(len(p["context"].split()) for p in paragraphs) <= 6 + 11 + 1  # a filler sentence, the fact, a stop
    unanswerable = 0
    for article in articles:  # an unanswerable question names an entity whose words the article never uses
        text = " ".join(p["context"] for p in article["paragraphs"])
        for qa in (qa for p in article["paragraphs"] for qa in p["qas"] if qa["is_impossible"]):
            unanswerable += 1
            modifier, noun = qa["question"].split(" of the ")[1].split()
            assert modifier.title() not in text.split() and noun.title() not in text.split(), qa["question"]
    assert unanswerable > 20


GENERATED = {  # name: (articles, seed, options)
    "learnable train": (1000, 0, LEARNABLE),  # scripts/train_synthetic_squad.sh's three files
    "learnable dev": (100, 1, LEARNABLE),
    "learnable test": (100, 2, LEARNABLE),
    "default difficulty": (300, 3, {}),
    "two facts, half unanswerable": (200, 4, {"facts": 2, "unanswerable": 0.5}),
    "one paragraph, no unanswerable": (200, 5, {"paragraphs": 1, "unanswerable": 0.0}),
}


@pytest.mark.parametrize("source", ["sample train.json", "sample dev.json", *GENERATED])
def test_no_answer_is_one_that_the_official_normalisation_empties(source: str, tmp_path: Path) -> None:
    """An answer "A", "An" or "An The" normalises to "" (lower case, punctuation and the articles a/an/the dropped):
    no prediction could match it, and the metric would count its question as unanswerable."""
    if source.startswith("sample"):
        path = SAMPLE / source.split()[1]
    else:
        articles, seed, options = GENERATED[source]
        path = tmp_path / "generated.json"
        write(path, articles, seed, **options)
    answers = [text for example in read_squad(path, on_bad_line="fail").examples for text, _ in example.answers]
    empty = [text for text in answers if not normalize_answer(text)]
    assert answers and not empty, f"{source}: {len(empty)} answer(s) normalise to nothing: {empty[:5]}"
