"""Answers end to end on the committed sample: DDP training with evaluation on every rank and best.pt,
then predict → submission → score, and distributed evaluation/prediction equal to one process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from distqa import evaluate, predict, score
from distqa.qa.nq.metric import read_gold, read_submission

from support.nq_examples import UNDECODABLE_LINES
from support.processes import clean_env, run_prepare
from support.repo import REPO_ROOT
from support.runs import run_training

pytestmark = pytest.mark.distributed

SAMPLE = REPO_ROOT / "data" / "nq-sample"
EVAL_LINE = re.compile(r"eval at step (\d+): micro-F1 ([0-9.]+)")


def run_on_two_ranks(module: str, args: list[str], timeout: int = 240) -> str:
    """``python -m MODULE ARGS`` on 2 ranks under torchrun; its standard output."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             "-m", module, *args], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{module} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def succeeded(ran: tuple[int, str, str]) -> str:
    """The standard output of a ``run_main`` call that must succeed."""
    code, out, err = ran
    assert code == 0, f"failed ({code}):\n{out}\n{err}"
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """2 ranks train the tiny model on the sample for 20 steps, evaluating every 5 (and at the end)."""
    root = tmp_path_factory.mktemp("answers")
    args = ["--task", "nq", "--run-name", "sample", "--output-dir", str(root / "results"),
            "--nq-cache-dir", str(root / "cache"), "--epochs", "4", "--eval-every", "5", "--eval-batch-size", "8",
            "--progress-bar", "false", "--log-every", "5"]
    run_prepare(["--only-if-needed", *args])  # the trainer's command line: prepare what it reads
    return root, run_training(args, nproc=2).stderr


def test_training_evaluates_on_every_rank_and_keeps_the_best_model(trained: tuple[Path, str]) -> None:
    root, log = trained
    run_dir = root / "results" / "sample"
    evals = [(int(step), float(f1)) for step, f1 in EVAL_LINE.findall(log)]
    assert [step for step, _ in evals] == [5, 10, 15, 20]
    # Both ranks scored windows (the sampler deals them out); only rank 0 logs the result.
    assert "[rank 1]" in log and "[rank 1] INFO distqa.training.trainer: eval" not in log

    best = torch.load(run_dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)
    best_step, best_f1 = max(evals, key=lambda e: (e[1], -e[0]))  # the first evaluation that reached the max
    assert best["evaluation"]["step"] == best_step
    assert best["evaluation"]["micro_f1"] == pytest.approx(best_f1, abs=1e-4)
    assert set(best["task_state"]) == {"long_threshold", "short_threshold", "max_answer_len"}
    assert "optimizer" not in best  # inference only

    final = torch.load(run_dir / "checkpoints" / "step-00000020.pt", map_location="cpu", weights_only=True)
    assert final["task_state"]["max_answer_len"] == 30
    assert (final["progress"]["best_metric"], final["progress"]["best_mode"]) == ("micro_f1", "max")
    assert final["progress"]["best_value"] == pytest.approx(best_f1, abs=1e-4)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/micro_f1")] == [5, 10, 15, 20]


def test_evaluation_over_two_ranks_equals_one_process(trained: tuple[Path, str], tmp_path: Path,
                                                      run_main: Callable[..., tuple[int, str, str]]) -> None:
    root, log = trained
    checkpoint = root / "results" / "sample" / "checkpoints" / "step-00000020.pt"
    common = ["--checkpoint", str(checkpoint), "--nq-cache-dir", str(root / "cache"), "--batch-size", "4"]
    one = succeeded(run_main(evaluate.main, *common, "--output", str(tmp_path / "one.csv")))
    two = run_on_two_ranks("distqa.evaluate", [*common, "--output", str(tmp_path / "two.csv")])
    metrics_one, metrics_two = json.loads(one), json.loads(two)
    # 61 windows over 2 ranks: the sampler repeats one window to even out the shares; it is dropped.
    assert metrics_one["examples"] == metrics_two["examples"] == 19
    for key in ("micro_f1", "long_f1", "short_f1", "tp", "fp", "fn"):
        assert metrics_one[key] == metrics_two[key], key
    for key in ("long_threshold", "short_threshold"):
        assert metrics_one[key] == pytest.approx(metrics_two[key], rel=1e-5)
    assert (tmp_path / "one.csv").read_text() == (tmp_path / "two.csv").read_text()
    # The same weights scored during training (2 ranks, other batches) gave the same micro-F1.
    assert metrics_one["micro_f1"] == pytest.approx(float(EVAL_LINE.findall(log)[-1][1]), abs=1e-4)


def test_predict_then_score_the_sample_test_file(trained: tuple[Path, str], tmp_path: Path,
                                                 run_main: Callable[..., tuple[int, str, str]]) -> None:
    root, _ = trained
    checkpoint = root / "results" / "sample" / "checkpoints" / "best.pt"
    common = ["--checkpoint", str(checkpoint), "--input", str(SAMPLE / "simplified-nq-test.jsonl"),
              "--nq-cache-dir", str(root / "cache")]
    succeeded(run_main(predict.main, *common, "--output", str(tmp_path / "one.csv")))
    run_on_two_ranks("distqa.predict", [*common, "--output", str(tmp_path / "two.csv")])
    assert (tmp_path / "one.csv").read_text() == (tmp_path / "two.csv").read_text()

    gold = read_gold(SAMPLE / "simplified-nq-test-gold.jsonl")
    answers = read_submission(tmp_path / "one.csv", expected_ids=gold)
    assert list(answers) == list(gold)  # every example, in input order
    scored = succeeded(run_main(score.main, "--gold", str(SAMPLE / "simplified-nq-test-gold.jsonl"),
                                "--submission", str(tmp_path / "one.csv")))
    result = json.loads(scored)
    assert result["examples"] == 40 and 0 <= result["micro_f1"] <= 1
    assert result["tp"] + result["fn"] > 0


@pytest.mark.usefixtures("no_torchrun_env")
def test_predict_reports_bad_input_in_one_line(trained: tuple[Path, str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Each case is ``python -m distqa.predict``'s main in this process (the module only exits with what main
    returns): one interpreter start-up instead of one per case. An uncaught exception fails the test as a traceback
    would."""
    root, _ = trained
    checkpoint = root / "results" / "sample" / "checkpoints" / "best.pt"
    broken = tmp_path / "broken.jsonl"
    lines = (SAMPLE / "simplified-nq-test.jsonl").read_text().splitlines()
    broken.write_text("\n".join([lines[0], lines[1][: len(lines[1]) // 2], *lines[2:4]]) + "\n")

    def undecodable(case: str, raw: bytes) -> Path:
        path = tmp_path / f"{case.replace(' ', '-')}.jsonl"
        path.write_bytes(b"".join(line.encode() + b"\n" for line in lines[:2]) + raw + b"\n")
        return path

    cases = {
        **{f"{case} line": (["--checkpoint", str(checkpoint), "--input", str(undecodable(case, raw))],
                            f"{case.replace(' ', '-')}.jsonl:3") for case, raw in UNDECODABLE_LINES.items()},
        "missing checkpoint": (["--checkpoint", str(tmp_path / "nope.pt"), "--input", str(broken)], "nope.pt"),
        "missing input": (["--checkpoint", str(checkpoint), "--input", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        "truncated line": (["--checkpoint", str(checkpoint), "--input", str(broken)], "broken.jsonl:2"),
    }
    for name, (args, expected) in cases.items():
        code = predict.main([*args, "--output", str(tmp_path / "s.csv"), "--nq-cache-dir", str(tmp_path / "cache")])
        stderr = capsys.readouterr().err
        assert code == 2, (name, stderr)
        assert "Traceback" not in stderr and expected in stderr, (name, stderr)
        assert not (tmp_path / "s.csv").exists(), name


def test_thresholds_given_to_predict_override_the_tuned_ones(trained: tuple[Path, str], tmp_path: Path,
                                                            run_main: Callable[..., tuple[int, str, str]]) -> None:
    root, _ = trained
    succeeded(run_main(predict.main, "--checkpoint", str(root / "results" / "sample" / "checkpoints" / "best.pt"),
                       "--input", str(SAMPLE / "simplified-nq-test.jsonl"), "--output", str(tmp_path / "blank.csv"),
                       "--nq-cache-dir", str(root / "cache"), "--long-threshold", "1e9", "--short-threshold", "1e9"))
    answers = read_submission(tmp_path / "blank.csv")
    assert len(answers) == 40 and not any(a.long or a.short for a in answers.values())


def test_a_run_without_validation_split_trains_without_evaluating(tmp_path: Path) -> None:
    result = run_training(["--task", "nq", "--run-name", "noval", "--output-dir", str(tmp_path / "results"),
                           "--nq-cache-dir", str(tmp_path / "cache"), "--validation-fraction", "0",
                           "--max-steps", "2", "--progress-bar", "false", "--tensorboard", "false"])
    assert "no evaluation: validation_fraction is 0" in result.stderr and "eval at step" not in result.stderr
    assert not (tmp_path / "results" / "noval" / "checkpoints" / "best.pt").exists()
    final = torch.load(tmp_path / "results" / "noval" / "checkpoints" / "step-00000002.pt", weights_only=True)
    assert final["task_state"] is None and final["evaluation"] is None
