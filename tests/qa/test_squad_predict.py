"""`predict` and `evaluate` with a squad checkpoint: chosen by the checkpoint's task, the official predictions file,
the stored no-answer threshold, and their errors in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distqa import evaluate, predict, prepare, score
from distqa.checkpoint.format import ModelCheckpoint, Progress
from distqa.qa.model import build_model
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.metric import read_gold

from support.repo import REPO_ROOT

DEV = REPO_ROOT / "data" / "squad-sample" / "dev.json"
WINDOWS = ["--max-seq-len", "64", "--max-question-len", "16", "--window-overlap", "16"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained squad model in a best.pt, with a stored no-answer threshold."""
    config = SquadConfig(task="squad", max_seq_len=64, max_question_len=16, window_overlap=16)
    torch.manual_seed(0)
    model = build_model(config)
    path = tmp_path_factory.mktemp("run") / "best.pt"
    ModelCheckpoint(model=model.state_dict(), config=config.to_dict(), evaluation=None, progress=Progress(),
                    task_state={"no_answer_threshold": 0.01, "max_answer_len": 30}, versions={}).save(path)
    return path


def run(main: object, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)  # type: ignore[operator]
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_writes_the_official_predictions_with_the_stored_threshold(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = ["--squad-cache-dir", str(tmp_path / "cache")]
    stored, everything = tmp_path / "stored.json", tmp_path / "everything.json"
    code, _, err = run(predict.main, ["--checkpoint", str(checkpoint), "--input", str(DEV), "--output", str(stored),
                                      *cache], capsys)
    assert code == 0, err
    assert "no-answer threshold 0.010" in err
    answers = json.loads(stored.read_text())
    assert list(answers) == list(read_gold(DEV))  # every question, in file order
    code, _, err = run(predict.main, ["--checkpoint", str(checkpoint), "--input", str(DEV), "--output",
                                      str(everything), "--no-answer-threshold=-1e9", *cache], capsys)
    assert code == 0, err
    everything_answered = json.loads(everything.read_text())
    assert all(everything_answered.values())  # every question has a span in its windows
    assert {q for q, a in answers.items() if a} <= set(everything_answered)
    code, out, _ = run(score.main, ["--format", "squad", "--gold", str(DEV), "--predictions", str(everything)], capsys)
    assert code == 0 and json.loads(out)["NoAns_f1"] == 0.0  # answering everything misses every unanswerable


def test_evaluate_needs_the_training_cache_then_scores_with_the_official_names(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = ["--squad-cache-dir", str(tmp_path / "cache")]
    code, _, err = run(evaluate.main, ["--checkpoint", str(checkpoint), *cache], capsys)
    error = err.strip().splitlines()[-1]  # after the log of the checkpoint's loading
    assert code == 2 and error.startswith("distqa.evaluate: error: no SQuAD feature cache for data/squad-sample/"
                                          "train.json with these settings")
    assert "python -m distqa.prepare --task squad" in error
    assert run(prepare.main, ["--task", "squad", *WINDOWS, *cache], capsys)[0] == 0
    output = tmp_path / "predictions.json"
    code, out, err = run(evaluate.main, ["--checkpoint", str(checkpoint), "--output", str(output), *cache], capsys)
    assert code == 0, err
    metrics = json.loads(out)
    assert list(metrics)[:9] == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                                 "NoAns_f1", "NoAns_total"] and metrics["total"] == 119
    assert "no_answer_threshold" in metrics and len(json.loads(output.read_text())) == 119


def test_flags_of_the_other_task_and_a_missing_input_are_one_line_errors(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--checkpoint", str(checkpoint), "--output", str(tmp_path / "out.json")]
    code, _, err = run(predict.main, [*common, "--input", str(DEV), "--long-threshold", "1"], capsys)
    assert code == 2 and err == (f"distqa.predict: error: --long-threshold is a setting of another task; {checkpoint} "
                                 "is of task 'squad'. Leave the flag out.\n")
    code, _, err = run(predict.main, [*common, "--input", str(tmp_path / "nope.json")], capsys)
    assert code == 2 and err.startswith(f"distqa.predict: error: --input: {tmp_path / 'nope.json'} is not a file")
    code, _, err = run(evaluate.main, ["--checkpoint", str(checkpoint), "--nq-cache-dir", "x"], capsys)
    assert code == 2 and "--nq-cache-dir is a setting of another task" in err and err.count("\n") == 1


def test_a_bad_record_in_the_input_is_one_line_advising_no_flag_predict_lacks(
        checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """predict answers every question, so it reads every record and has no --on-bad-line: its error says to fix
    the record, without the advice prepare and train give to skip it."""
    broken = tmp_path / "broken.json"
    document = json.loads(DEV.read_text())
    document["data"][0]["paragraphs"][0]["qas"][0]["question"] = 7
    broken.write_text(json.dumps(document))
    code, _, err = run(predict.main, ["--checkpoint", str(checkpoint), "--input", str(broken), "--output",
                                      str(tmp_path / "out.json")], capsys)
    errors = [line for line in err.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1, err
    assert errors[0].startswith(f"distqa.predict: error: {broken}: data[0].paragraphs[0].qas[0]: field 'question'")
    assert errors[0].endswith("Fix or remove the record.") and "--on-bad-line" not in err
