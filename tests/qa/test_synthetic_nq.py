"""The synthetic NQ generator, the committed sample and the download script (no network)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import zipfile
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from distqa.qa.answers import AnswerType
from distqa.qa.nq.synthetic import (
    DEFAULT_ANSWER_MIX,
    answer_type_of,
    generate_example,
    iter_examples,
    main,
    make_example,
    parse_answer_mix,
    write_jsonl,
)
from distqa.qa.synthetic_text import ATTRIBUTES, CANDIDATE_TAGS, FILLER, MODIFIERS, NOUNS, PROPERTIES

from support.repo import REPO_ROOT

SAMPLE_DIR = REPO_ROOT / "data" / "nq-sample"
TRAIN_KEYS = ["example_id", "question_text", "document_text", "document_url", "long_answer_candidates",
              "annotations"]
TAG = re.compile(r"^<(/?)([A-Za-z][A-Za-z0-9]*)>$")
SMALL = {"min_doc_tokens": 40, "max_doc_tokens": 400}


def candidate_spans(tokens: list[str]) -> list[tuple[int, int, bool]]:
    """Candidates recomputed from the HTML tags alone: (start, end exclusive, top_level), in document order."""
    stack: list[tuple[str, int]] = []
    spans: dict[int, tuple[int, int, bool]] = {}
    for i, token in enumerate(tokens):
        match = TAG.match(token)
        if not match:
            continue
        closing, name = match.groups()
        if not closing:
            stack.append((name, i))
            continue
        assert stack and stack[-1][0] == name, f"unbalanced </{name}> at token {i}"
        _, start = stack.pop()
        if name in CANDIDATE_TAGS:
            top_level = not any(open_name in CANDIDATE_TAGS for open_name, _ in stack)
            spans[start] = (start, i + 1, top_level)
    assert not stack, f"unclosed tags {stack}"
    return [spans[start] for start in sorted(spans)]


def check_example(example: dict[str, Any], test: bool = False) -> None:
    """Every rule of the simplified-NQ format, plus the synthetic task's promises."""
    assert list(example) == (TRAIN_KEYS[:-1] if test else TRAIN_KEYS)
    example_id = example["example_id"]
    assert type(example_id) is int and -(2**63) <= example_id < 2**63
    assert isinstance(example["question_text"], str) and example["question_text"].strip()
    assert example["document_url"].startswith("https://en.wikipedia.org//w/index.php?title=")
    text = example["document_text"]
    assert isinstance(text, str) and text == text.strip()
    tokens = text.split(" ")
    assert all(tokens) and not any(c.isspace() for t in tokens for c in t)

    candidates = example["long_answer_candidates"]
    for c in candidates:
        assert list(c) == ["start_token", "end_token", "top_level"]
        assert type(c["start_token"]) is int and type(c["end_token"]) is int and type(c["top_level"]) is bool
        assert 0 <= c["start_token"] < c["end_token"] <= len(tokens)
    assert [(c["start_token"], c["end_token"], c["top_level"]) for c in candidates] == candidate_spans(tokens)
    if test:
        return

    [annotation] = example["annotations"]
    assert list(annotation) == ["annotation_id", "yes_no_answer", "long_answer", "short_answers"]
    assert type(annotation["annotation_id"]) is int
    assert annotation["yes_no_answer"] in ("NONE", "YES", "NO")
    long = annotation["long_answer"]
    assert list(long) == ["start_token", "end_token", "candidate_index"]
    shorts = annotation["short_answers"]
    if long["candidate_index"] == -1:
        assert long == {"start_token": -1, "end_token": -1, "candidate_index": -1}
        assert shorts == [] and annotation["yes_no_answer"] == "NONE"
    else:
        candidate = candidates[long["candidate_index"]]
        assert (long["start_token"], long["end_token"]) == (candidate["start_token"], candidate["end_token"])
        assert candidate["top_level"]
    for span in shorts:
        assert list(span) == ["start_token", "end_token"]
        assert long["start_token"] <= span["start_token"] < span["end_token"] <= long["end_token"]
        assert not any(TAG.match(t) for t in tokens[span["start_token"]:span["end_token"]])
    if annotation["yes_no_answer"] != "NONE":
        assert shorts == [] and long["candidate_index"] >= 0
    check_task(example, tokens)


def check_task(example: dict[str, Any], tokens: list[str]) -> None:
    """The learnable task of the module docstring: the question's facts are where the annotation says."""
    question = example["question_text"].split(" ")
    kind = answer_type_of(example)
    if question[0] == "is":
        modifier, noun, topic = question[2:5]
    else:
        topic, modifier, noun = question[-5], question[-2], question[-1]
    assert modifier in MODIFIERS and noun in NOUNS and topic in (*ATTRIBUTES, *PROPERTIES)
    name = [modifier.capitalize(), noun.capitalize()]
    mentions = [i for i in range(len(tokens) - 1) if tokens[i:i + 2] == name]
    if kind == AnswerType.UNKNOWN:
        assert not mentions, "an UNKNOWN question's entity must not appear in the document"
        return
    if question[0] == "is":
        facts = [i for i in mentions if tokens[i + 2:i + 5] in (["is", topic, "."], ["is", "not", topic])]
    else:
        facts = [i for i in mentions if tokens[i - 3:i] == [topic, "of", "the"]]
    assert len(facts) == 1, f"exactly one fact about ({' '.join(name)}, {topic}) expected, found {len(facts)}"
    fact = facts[0]
    long = example["annotations"][0]["long_answer"]
    assert long["start_token"] < fact < long["end_token"]
    shorts = example["annotations"][0]["short_answers"]
    if kind in (AnswerType.YES, AnswerType.NO):
        assert question[0] == "is" and (tokens[fact + 3] == "not") == (kind == AnswerType.NO)
    elif kind == AnswerType.LONG:
        assert question[:3] == ["tell", "me", "about"] and tokens[fact + 2:fact + 7] == [
            "has", "a", "long", "history", "."]
    else:
        assert question[:2] == ["what", "is"] and tokens[fact + 2] == "is" and 1 <= len(shorts) <= 2
        assert shorts[0]["start_token"] == fact + 3
        assert all(1 <= s["end_token"] - s["start_token"] <= (4 if len(shorts) == 1 else 2) for s in shorts)
        if len(shorts) == 2:
            assert tokens[shorts[0]["end_token"]] == "and" and shorts[1]["start_token"] == shorts[0]["end_token"] + 1
        assert tokens[shorts[-1]["end_token"]] == "."


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_every_generated_line_is_valid(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", 400, seed=3, min_doc_tokens=20, max_doc_tokens=3000, long_docs=2)
    examples = read_jsonl(tmp_path / "train.jsonl")
    assert len(examples) == 400
    for example in examples:
        check_example(example)
    assert len({e["example_id"] for e in examples}) == 400
    tags = Counter(t for e in examples for t in e["document_text"].split(" ") if TAG.match(t))
    assert {f"<{name}>" for name in (*CANDIDATE_TAGS, "H1", "H2", "Th", "Td")} <= set(tags)
    nested = sum(not c["top_level"] for e in examples for c in e["long_answer_candidates"])
    assert nested > 0


def test_answer_blocks_and_positions_vary(tmp_path: Path) -> None:
    """Answers sit in paragraphs, tables and lists, early and far beyond the first window, and near the end."""
    blocks, far, near_end, two_spans = Counter(), 0, 0, 0
    for example in iter_examples(400, seed=5, min_doc_tokens=1000, max_doc_tokens=2000):
        annotation = example["annotations"][0]
        long = annotation["long_answer"]
        if long["candidate_index"] < 0:
            continue
        tokens = example["document_text"].split(" ")
        blocks[tokens[long["start_token"]]] += 1
        far += long["start_token"] > 512
        near_end += long["start_token"] > 0.85 * len(tokens)
        two_spans += len(annotation["short_answers"]) == 2
        assert long["end_token"] - long["start_token"] <= 140, "an answer block should fit in one window"
    assert {"<P>", "<Table>", "<Ul>", "<Dl>"} <= set(blocks) and blocks["<P>"] > sum(blocks.values()) / 2
    assert far > 50 and near_end > 20 and two_spans > 5


def test_same_seed_same_bytes_and_examples_are_addressable(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_jsonl(a, 30, seed=7, **SMALL)
    write_jsonl(b, 30, seed=7, **SMALL)
    write_jsonl(c, 30, seed=8, **SMALL)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    lines = read_jsonl(a)
    assert lines[12] == make_example(7, 12, **SMALL)
    assert list(iter_examples(5, seed=7, start=10, **SMALL)) == lines[10:15]
    rng_a, rng_b = random.Random(1), random.Random(1)
    assert generate_example(rng_a, **SMALL) == generate_example(rng_b, **SMALL)


def test_test_form_has_no_annotations_and_the_train_form_is_its_gold(tmp_path: Path) -> None:
    main(["--output", str(tmp_path / "test.jsonl"), "--examples", "20", "--seed", "4", "--test", "--quiet"])
    main(["--output", str(tmp_path / "gold.jsonl"), "--examples", "20", "--seed", "4", "--quiet"])
    tests, golds = read_jsonl(tmp_path / "test.jsonl"), read_jsonl(tmp_path / "gold.jsonl")
    for test, gold in zip(tests, golds, strict=True):
        check_example(test, test=True)
        assert "annotations" not in test
        assert test == {k: v for k, v in gold.items() if k != "annotations"}


def test_answer_mix_is_honoured() -> None:
    n = 3000
    counts = Counter(answer_type_of(e).name.lower()
                     for e in iter_examples(n, seed=11, min_doc_tokens=20, max_doc_tokens=40))
    for name, p in DEFAULT_ANSWER_MIX.items():
        assert abs(counts[name] / n - p) < 0.03, (name, counts[name] / n, p)

    mix = parse_answer_mix("short=3,yes=1")
    assert mix == {"unknown": 0.0, "yes": 0.25, "no": 0.0, "short": 0.75, "long": 0.0}
    kinds = {answer_type_of(e) for e in iter_examples(200, seed=1, answer_mix=mix, **SMALL)}
    assert kinds == {AnswerType.SHORT, AnswerType.YES}
    forced = make_example(0, 0, answer_type=AnswerType.NO, **SMALL)
    assert answer_type_of(forced) == AnswerType.NO
    for bad in ("short", "short=x", "maybe=1", "short=-1", "short=0,long=0"):
        with pytest.raises(ValueError, match="answer mix"):
            parse_answer_mix(bad)


def test_unicode_and_punctuation_tokens_appear(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "u.jsonl", 100, seed=2, **SMALL)
    raw = (tmp_path / "u.jsonl").read_text(encoding="utf-8")
    assert "\\u" not in raw, "written as UTF-8, not as \\u escapes"
    tokens = Counter(t for e in read_jsonl(tmp_path / "u.jsonl") for t in e["document_text"].split(" "))
    assert any(not t.isascii() for t in tokens)
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in t) for t in tokens), "CJK"
    assert any(any(ord(ch) > 0xFFFF for ch in t) for t in tokens), "emoji (outside the BMP)"
    assert {",", ".", "(", ")", "%"} <= set(tokens)


def test_words_are_single_tokens_of_the_tiny_tokenizer() -> None:
    vocab = json.loads((REPO_ROOT / "data/tiny-bert/tokenizer.json").read_text())["model"]["vocab"]
    words = {*FILLER, *MODIFIERS, *NOUNS, *ATTRIBUTES, *PROPERTIES}
    assert not [w for w in words if w not in vocab]
    reserved = {*MODIFIERS, *NOUNS, *ATTRIBUTES, *PROPERTIES}
    assert len(reserved) == len(MODIFIERS) + len(NOUNS) + len(ATTRIBUTES) + len(PROPERTIES)
    assert not reserved & set(FILLER)


def entity_mentions(tokens: list[str]) -> list[tuple[str, str]]:
    modifiers, nouns = {m.capitalize() for m in MODIFIERS}, {n.capitalize() for n in NOUNS}
    return [(a.lower(), b.lower()) for a, b in pairwise(tokens) if a in modifiers and b in nouns]


def test_distractors_follow_the_difficulty_rates() -> None:
    for example in iter_examples(100, seed=6, distractor_rate=0.0, **SMALL):
        mentions = entity_mentions(example["document_text"].split(" "))
        check_example(example)
        assert len(mentions) == (answer_type_of(example) != AnswerType.UNKNOWN)

    same = hard = other = 0
    for example in iter_examples(300, seed=6, answer_mix={"short": 1}, **SMALL):
        question = example["question_text"].split(" ")
        entity = (question[-2], question[-1])
        for mention in entity_mentions(example["document_text"].split(" ")):
            if mention == entity:
                same += 1
            elif mention[0] == entity[0] or mention[1] == entity[1]:
                hard += 1
            else:
                other += 1
    distractors = same - 300 + hard + other  # one mention per example is the answer's fact
    assert 0.12 < (same - 300) / distractors < 0.28
    assert 0.18 < hard / (hard + other) < 0.42
    with pytest.raises(ValueError, match="distractor_rate"):
        make_example(0, 0, distractor_rate=1.5)


def test_long_documents(tmp_path: Path) -> None:
    example = make_example(0, 0, min_doc_tokens=12_000, max_doc_tokens=12_000, answer_type=AnswerType.SHORT)
    check_example(example)
    assert len(example["document_text"].split(" ")) >= 12_000
    lengths = [len(e["document_text"].split(" "))
               for e in iter_examples(20, seed=0, min_doc_tokens=50, max_doc_tokens=100, long_docs=2,
                                      long_doc_tokens=5000)]
    assert sum(n > 2000 for n in lengths) == 2 and max(lengths) <= 5200 and sorted(lengths)[-3] < 250


def test_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "x.jsonl")
    for args in (["--min-doc-tokens", "10", "--max-doc-tokens", "5"], ["--answer-mix", "huh=1"],
                 ["--long-docs", "5"], ["--hard-negative-rate", "2"]):
        with pytest.raises(SystemExit) as exc:
            main(["--output", out, "--examples", "2", *args])
        assert exc.value.code == 2
    assert not Path(out).exists()
    assert main(["--output", out, "--examples", "2"]) == 0
    assert "2 examples" in capsys.readouterr().err


def test_committed_sample_is_valid_and_regenerates_byte_identically(tmp_path: Path) -> None:
    script = REPO_ROOT / "scripts" / "make_nq_sample.sh"
    subprocess.run([str(script), str(tmp_path)], check=True, capture_output=True, text=True,
                   env={**os.environ, "PYTHON": sys.executable})
    names = ["simplified-nq-train.jsonl", "simplified-nq-test.jsonl", "simplified-nq-test-gold.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for name in names:
        committed = SAMPLE_DIR / name
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), (
            f"{committed} differs from what scripts/make_nq_sample.sh writes: run `make nq-sample` and commit")
    train = read_jsonl(SAMPLE_DIR / "simplified-nq-train.jsonl")
    test = read_jsonl(SAMPLE_DIR / "simplified-nq-test.jsonl")
    gold = read_jsonl(SAMPLE_DIR / "simplified-nq-test-gold.jsonl")
    for example in train + gold:
        check_example(example)
    for example in test:
        check_example(example, test=True)
    assert {answer_type_of(e) for e in train} == set(AnswerType)
    # The gold is the test file plus annotations: same examples, same order.
    assert [{k: v for k, v in e.items() if k != "annotations"} for e in gold] == test
    assert sum(f.stat().st_size for f in SAMPLE_DIR.glob("*.jsonl")) < 700_000


# ---- scripts/download_nq.sh with a stand-in `kaggle` on PATH -------------------------------------------

DOWNLOAD = REPO_ROOT / "scripts" / "download_nq.sh"
FAKE_KAGGLE = """#!{python}
import os, sys, zipfile
# Stand-in for the Kaggle CLI: records its arguments and credentials, then acts out FAKE_KAGGLE_MODE.
args = sys.argv[1:]
with open(os.environ["FAKE_KAGGLE_LOG"], "w") as f:
    f.write(" ".join(args) + "\\n" + os.environ.get("KAGGLE_USERNAME", "-") + " " + os.environ.get("KAGGLE_KEY", "-"))
mode = os.environ.get("FAKE_KAGGLE_MODE", "ok")
if mode == "403":
    print("403 - Forbidden - You must accept this competition's rules before you'll be able to download files.")
    sys.exit(1)
directory = args[args.index("-p") + 1]
with zipfile.ZipFile(os.path.join(directory, "tensorflow2-question-answering.zip"), "w") as z:
    z.writestr("simplified-nq-test.jsonl", '{{"example_id": 1}}\\n')
    if mode != "incomplete":
        z.writestr("simplified-nq-train.jsonl", '{{"example_id": 2}}\\n')
    z.writestr("sample_submission.csv", "example_id,PredictionString\\n")
print("Downloading tensorflow2-question-answering.zip to " + directory)
"""


@pytest.fixture
def fake_kaggle(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has the stand-in `kaggle` and whose HOME has no credentials."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kaggle = bin_dir / "kaggle"
    kaggle.write_text(FAKE_KAGGLE.format(python=sys.executable))
    kaggle.chmod(0o755)
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGGLE_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp_path / "home"),
               FAKE_KAGGLE_LOG=str(tmp_path / "kaggle.log"))
    return env


def download(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DOWNLOAD), "--dir", str(tmp_path / "nq"), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_download_help_and_bad_arguments(tmp_path: Path) -> None:
    result = subprocess.run([str(DOWNLOAD), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "pip install kaggle" in result.stdout and "--env-file" in result.stdout
    result = subprocess.run([str(DOWNLOAD), "--bogus"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown argument" in result.stderr


def test_download_without_kaggle_cli_says_how_to_install_it(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    if any(Path(p, "kaggle").exists() for p in env["PATH"].split(":")):
        pytest.skip("a real kaggle CLI is installed system-wide")
    result = download(tmp_path, env)
    assert result.returncode == 1 and "pip install kaggle" in result.stderr


def test_download_without_credentials_names_both_ways(tmp_path: Path, fake_kaggle: dict[str, str]) -> None:
    result = download(tmp_path, fake_kaggle, "--env-file", str(tmp_path / "missing.env"))
    assert result.returncode == 1
    assert "KAGGLE_USERNAME" in result.stderr and "kaggle.json" in result.stderr
    assert not (tmp_path / "kaggle.log").exists(), "kaggle must not run without credentials"


def test_download_with_env_file_unzips_and_verifies(tmp_path: Path, fake_kaggle: dict[str, str]) -> None:
    env_file = tmp_path / "dot.env"
    env_file.write_text("DISTQA_LR=1e-4\nKAGGLE_USERNAME=alice\nexport KAGGLE_KEY=\"s3cr3t\"\n")
    result = download(tmp_path, fake_kaggle, "--env-file", str(env_file))
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "kaggle.log").read_text().splitlines()
    assert log[0] == f"competitions download -c tensorflow2-question-answering -p {tmp_path / 'nq'}"
    assert log[1] == "alice s3cr3t"
    files = sorted(p.name for p in (tmp_path / "nq").iterdir())
    assert files == ["sample_submission.csv", "simplified-nq-test.jsonl", "simplified-nq-train.jsonl"]
    assert "simplified-nq-train.jsonl" in result.stdout


def test_download_environment_wins_and_kaggle_json_works(tmp_path: Path, fake_kaggle: dict[str, str]) -> None:
    env_file = tmp_path / "dot.env"
    env_file.write_text("KAGGLE_USERNAME=alice\nKAGGLE_KEY=old\n")
    result = download(tmp_path, {**fake_kaggle, "KAGGLE_USERNAME": "bob", "KAGGLE_KEY": "new"},
                      "--env-file", str(env_file), "--keep-zip")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kaggle.log").read_text().splitlines()[1] == "bob new"
    assert zipfile.is_zipfile(tmp_path / "nq" / "tensorflow2-question-answering.zip")

    config = Path(fake_kaggle["HOME"]) / ".kaggle"
    config.mkdir()
    (config / "kaggle.json").write_text('{"username": "carol", "key": "k"}')
    result = download(tmp_path, fake_kaggle, "--env-file", str(tmp_path / "missing.env"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kaggle.log").read_text().splitlines()[1] == "- -"  # the CLI reads kaggle.json itself


def test_download_forbidden_points_to_the_rules(tmp_path: Path, fake_kaggle: dict[str, str]) -> None:
    env = {**fake_kaggle, "KAGGLE_USERNAME": "a", "KAGGLE_KEY": "b", "FAKE_KAGGLE_MODE": "403"}
    result = download(tmp_path, env)
    assert result.returncode == 1
    assert "accept the competition rules" in result.stderr
    assert "tensorflow2-question-answering/rules" in result.stderr


def test_download_reports_missing_files(tmp_path: Path, fake_kaggle: dict[str, str]) -> None:
    env = {**fake_kaggle, "KAGGLE_USERNAME": "a", "KAGGLE_KEY": "b", "FAKE_KAGGLE_MODE": "incomplete"}
    result = download(tmp_path, env)
    assert result.returncode == 1 and "simplified-nq-train.jsonl" in result.stderr
