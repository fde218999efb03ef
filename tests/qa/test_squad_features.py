"""SQuAD windows from the tokenizer's own pair encoding, labels as run_qa.py's, and the fingerprinted cache."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from distqa import prepare
from distqa.config import ConfigError
from distqa.config.flags import build_arg_parser, prepare_sections
from distqa.encoders.config import TINY_MODEL_DIR
from distqa.qa.answers import AnswerType
from distqa.qa.feature_store import load_manifest, read_table
from distqa.qa.squad.cache import (
    SquadCacheRequest,
    SquadWindows,
    build_squad_cache,
    cached,
    hold_out,
    open_examples,
)
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.reader import SquadExample, read_squad
from distqa.qa.squad.synthetic import write
from distqa.qa.squad.windows import SquadFeaturizer, SquadWindowSettings, answer_span
from distqa.tasks import task_class

from support.repo import REPO_ROOT

SAMPLE = REPO_ROOT / "data" / "squad-sample"
TOKENIZER = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
# Short windows, so that many contexts need two or three.
SETTINGS = SquadWindowSettings(max_seq_len=48, max_question_len=16, window_overlap=12)


def run_qa_module() -> object:
    """bench/run_qa_features.py: run_qa.py's prepare_train_features, written as run_qa.py has it."""
    spec = importlib.util.spec_from_file_location("run_qa_features", REPO_ROOT / "bench" / "run_qa_features.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def featurize(examples: list[SquadExample], settings: SquadWindowSettings = SETTINGS) -> object:
    featurizer = SquadFeaturizer(TOKENIZER.backend_tokenizer.to_str(), TOKENIZER.pad_token_id, settings)
    answers = [answer_span(*e.answers[0]) if e.answers else None for e in examples]
    return featurizer.featurize([e.question for e in examples], [e.context for e in examples], answers)


def test_windows_are_the_tokenizers_pair_encoding_and_labels_are_run_qas() -> None:
    """The real thing runs here: transformers' tokenizer call and run_qa.py's labelling, on the committed sample."""
    examples = read_squad(SAMPLE / "train.json").examples
    features = featurize(examples)
    reference = run_qa_module().prepare_train_features(  # type: ignore[attr-defined]
        {"question": [e.question for e in examples], "context": [e.context for e in examples],
         "answers": [{"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]}
                     for e in examples]},
        TOKENIZER, max_seq_length=SETTINGS.max_seq_len, doc_stride=SETTINGS.window_overlap, pad_to_max_length=False)
    assert len(reference["input_ids"]) == len(features.input_ids) > 1.5 * len(examples)  # many contexts overflow
    lengths = features.columns["length"]
    agree = 0
    for row, (ids, types) in enumerate(zip(reference["input_ids"], reference["token_type_ids"], strict=True)):
        assert features.input_ids[row, :lengths[row]].tolist() == ids
        assert (features.input_ids[row, lengths[row]:] == TOKENIZER.pad_token_id).all()
        segment = features.columns["segment_start"][row]
        assert [int(segment <= i) for i in range(lengths[row])] == types
        ours = (features.columns["start_position"][row], features.columns["end_position"][row])
        theirs = (reference["start_positions"][row], reference["end_positions"][row])
        # run_qa.py's one known difference: an answer starting in the window's last context token walks its start
        # past the context onto [SEP] ("we could go after the last offset", its comment says).
        agree += ours == theirs
        if ours != theirs:
            assert theirs[0] == lengths[row] - 1 and ours[0] == features.columns["context_end"][row] - 1
    assert agree >= len(lengths) - 5


def test_every_gold_answer_is_recovered_from_its_window_labels() -> None:
    examples = read_squad(SAMPLE / "train.json").examples
    features = featurize(examples)
    columns, bounds = features.columns, np.concatenate([[0], np.cumsum(2 * features.offset_counts)])
    positive = np.flatnonzero(columns["answer_type"] != 0)
    assert len(positive) > 0.5 * sum(bool(e.answers) for e in examples)
    for row in positive:
        example = examples[columns["example_index"][row]]
        offsets = features.offsets[bounds[row]:bounds[row + 1]].reshape(-1, 2)
        first, last = columns["start_position"][row], columns["end_position"][row]
        start = columns["context_start"][row]
        assert start <= first <= last < columns["context_end"][row]
        assert example.context[offsets[first - start, 0]:offsets[last - start, 1]] == example.answers[0][0]
    # Every answerable question has a positive window, unless its answer is longer than a window's context part.
    assert features.stats.unreachable == 0 and features.stats.answerable == sum(bool(e.answers) for e in examples)


def test_unanswerable_questions_keep_every_window_pointing_at_the_null_answer() -> None:
    context = " ".join(f"word{i} ." for i in range(60))
    examples = [SquadExample("a", "what", context),
                SquadExample("b", "which", context, (("word59", context.index("word59")),)),
                SquadExample("c", "where", "x", ())]
    features = featurize(examples)
    columns = features.columns
    windows = np.bincount(columns["example_index"])
    assert windows[0] == windows[1] > 3 and windows[2] == 1  # no window is dropped
    unanswerable = columns["example_index"] != 1
    assert (columns["start_position"][unanswerable] == 0).all() and (columns["answer_type"][unanswerable] == 0).all()
    assert columns["answer_type"][columns["example_index"] == 1].tolist()[-1] == AnswerType.SHORT  # the last window
    assert (features.stats.answerable, features.stats.unanswerable, features.stats.positive) == (1, 2, 1)


def test_a_long_question_is_cut_at_a_token_boundary_and_a_tight_window_is_refused() -> None:
    long_question = " ".join(["capital"] * 30)
    features = featurize([SquadExample("a", long_question, "The capital is Rome .", (("Rome", 15),))])
    assert features.input_ids[0, 1:17].tolist() == [TOKENIZER.convert_tokens_to_ids("capital")] * 16
    assert TOKENIZER.convert_ids_to_tokens(int(features.input_ids[0, 17])) == "[SEP]"
    with pytest.raises(ValueError, match=r"window_overlap \(29\) must be below max_seq_len - max_question_len - 3 "
                                         r"special tokens of this tokenizer's pair template = 29"):
        featurize([], SquadWindowSettings(48, 16, 29))
    with pytest.raises(ConfigError, match=r"window_overlap \(28\) must be at least 0 and below max_seq_len - "
                                          r"max_question_len - 4 = 28"):
        SquadConfig(max_seq_len=48, max_question_len=16, window_overlap=28)


def test_a_tokenizer_whose_pair_template_has_no_leading_special_token_is_refused(tmp_path: Path) -> None:
    """The null answer is position 0: the template must put a special token there ([CLS], <s>)."""
    without_template = json.loads(TOKENIZER.backend_tokenizer.to_str()) | {"post_processor": None}
    request = SquadCacheRequest(str(SAMPLE / "dev.json"), "", 0.0, True, SETTINGS, json.dumps(without_template),
                                TOKENIZER.pad_token_id)
    with pytest.raises(ConfigError, match=r"the tokenizer's pair template does not begin with a special token "
                                          r"\(\[CLS\] or <s>\).*use an encoder family whose template does\.$"):
        build_squad_cache(request, tmp_path / "cache")


# --- the cache ---------------------------------------------------------------------------------------

def request_for(train: Path, validation: str = "", fraction: float = 0.0) -> SquadCacheRequest:
    return SquadCacheRequest.from_tokenizer(TOKENIZER, train, SETTINGS, validation, fraction)


def test_the_cache_is_reused_and_rebuilt_when_a_byte_of_the_input_changes(tmp_path: Path) -> None:
    train = tmp_path / "train.json"
    shutil.copy(SAMPLE / "train.json", train)
    first = build_squad_cache(request_for(train, str(SAMPLE / "dev.json")), tmp_path / "cache")
    assert build_squad_cache(request_for(train, str(SAMPLE / "dev.json")), tmp_path / "cache") == first
    manifest = load_manifest(first)
    assert manifest["splits"]["train"]["examples"] == 365 and manifest["splits"]["validation"]["examples"] == 119
    assert manifest["splits"]["train"]["unanswerable"] == 123
    # One digit of one answer_start, in the middle of the file: the same size, another cache.
    text = train.read_text()
    position = text.index('"answer_start": 1', len(text) // 2) + len('"answer_start": 1')
    train.write_text(text[:position] + str((int(text[position]) + 1) % 10) + text[position + 1:])
    assert train.stat().st_size == (SAMPLE / "train.json").stat().st_size
    assert cached(request_for(train, str(SAMPLE / "dev.json")), tmp_path / "cache") is None


def test_one_or_two_processes_build_the_same_cache(tmp_path: Path) -> None:
    source = tmp_path / "train.jsonl"
    write(source, 30, seed=3)
    one = build_squad_cache(request_for(source, fraction=0.2), tmp_path / "one", num_proc=1)
    two = build_squad_cache(request_for(source, fraction=0.2), tmp_path / "two", num_proc=2)
    for split in ("train", "validation"):
        for name in ("windows.arrow", "examples.arrow"):  # the same rows (in record batches of other sizes)
            assert read_table(one / split / name).equals(read_table(two / split / name)), (split, name)


def test_held_out_validation_keeps_whole_contexts(tmp_path: Path) -> None:
    examples = read_squad(SAMPLE / "train.json").examples
    train, validation = hold_out(examples, 0.2)
    assert len(train) + len(validation) == len(examples)
    assert abs(len(validation) - 0.2 * len(examples)) <= 4  # a context holds at most 4 questions
    assert not {e.context for e in train} & {e.context for e in validation}
    # The same contexts again when the file is reordered.
    assert {e.id for e in hold_out(examples[::-1], 0.2)[1]} == {e.id for e in validation}


def test_windows_read_back_as_batches_of_the_tokenizers_inputs(tmp_path: Path) -> None:
    directory = build_squad_cache(request_for(SAMPLE / "dev.json", fraction=0.5), tmp_path / "cache")
    windows = SquadWindows(directory, "validation")
    examples = open_examples(directory, "validation").to_pylist()
    item = windows[0]
    example = examples[int(windows.columns["example_index"][0])]
    encoded = TOKENIZER(example["question"], example["context"], truncation="only_second",
                        max_length=SETTINGS.max_seq_len, stride=SETTINGS.window_overlap)
    length = len(encoded["input_ids"])
    assert item["input_ids"][:length].tolist() == encoded["input_ids"]
    assert item["token_type_ids"][:length].tolist() == encoded["token_type_ids"]
    assert item["attention_mask"].sum() == length and item["input_ids"].shape == (SETTINGS.max_seq_len,)
    assert len(windows.offsets()) == len(windows)
    with pytest.raises(IndexError):
        windows[len(windows)]


def test_prepare_builds_the_squad_cache_and_reports_bad_data_in_one_line(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--task", "squad", "--squad-cache-dir", str(tmp_path / "cache")]
    assert prepare.main(flags) == 0
    built = capsys.readouterr()
    assert (Path(built.out.strip()) / "manifest.json").is_file()
    broken = tmp_path / "broken.json"
    document = json.loads((SAMPLE / "dev.json").read_text())
    answered = next(qa for qa in document["data"][0]["paragraphs"][0]["qas"] if qa["answers"])
    answered["answers"][0]["answer_start"] += 1
    broken.write_text(json.dumps(document))
    assert prepare.main([*flags, "--squad-validation-file", str(broken), "--on-bad-line", "fail"]) == 2
    failed = capsys.readouterr()
    assert failed.err.startswith(f"distqa.prepare: error: {broken}: data[0].paragraphs[0].qas[")
    assert failed.err.count("\n") == 1 and "which does not point at its text" in failed.err
    # The advice names a flag that prepare's own parser (the one load_config builds for it) accepts.
    advice = failed.err.split("Or pass ")[1].split(" to skip")[0]
    prepare_parser = build_arg_parser("python -m distqa.prepare", task_class("squad"), prepare_sections)
    assert advice == "--on-bad-line skip" and prepare_parser.parse_known_args(advice.split())[1] == []
