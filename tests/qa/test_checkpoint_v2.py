"""Checkpoints of format 2, written by main before the task seam (tests/fixtures/checkpoint-v2, with the command
that wrote them), still work: a run resumes from one to the weights the old code reached, and predict and
evaluate give, byte for byte, what they gave with the old code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.compare import assert_close_values, max_difference
from support.processes import clean_env
from support.repo import REPO_ROOT

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "checkpoint-v2"
WINDOWS = ["--model-name-or-path", "tests/fixtures/checkpoint-v2/encoder", "--max-seq-len", "64",
           "--max-question-len", "16", "--doc-stride", "32"]
"""The run-defining settings the fixture was trained with (README.md there)."""


def run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_a_run_resumes_from_a_format_2_checkpoint_to_the_weights_the_old_code_reached(cache: Path,
                                                                                      tmp_path: Path) -> None:
    checkpoints = tmp_path / "v2" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("step-00000002.pt", "step-00000002.pt.crc32"):  # verified by its sidecar, as written
        shutil.copy(FIXTURE / name, checkpoints / name)
    result = run("distqa.train", "--preset", "none", "--task", "nq", *WINDOWS, "--nq-cache-dir", str(cache),
                 "--num-proc", "1", "--global-batch-size", "8", "--per-rank-batch-size", "4", "--max-steps", "4",
                 "--eval-every", "2", "--checkpoint-every", "2", "--eval-batch-size", "32", "--output-dir",
                 str(tmp_path), "--run-name", "v2", "--progress-bar", "false", "--tensorboard", "false",
                 "--warmup-steps", "1")
    assert f"resumed from {checkpoints / 'step-00000002.pt'} at step 2" in result.stderr
    resumed = torch.load(checkpoints / "step-00000004.pt", weights_only=True)
    written_by_old_code = torch.load(FIXTURE / "step-00000004.pt", weights_only=True)
    # Equal bit for bit on the CPU that wrote the fixture; another CPU's kernels round the last bits their own way
    # (the old code itself, resuming this fixture on an AMD EPYC, ends 3.7e-9 away), hence the suite's resume bound.
    assert max_difference(resumed["model"], written_by_old_code["model"]) < 1e-6
    assert resumed["format_version"] == 3 and resumed["config"]["task"] == "nq"
    assert_close_values(resumed["task_state"], written_by_old_code["decoding"])  # the thresholds tuned at step 4


def test_predict_and_evaluate_read_a_format_2_best_pt_as_the_old_code_did(cache: Path, tmp_path: Path) -> None:
    submission = tmp_path / "submission.csv"
    run("distqa.predict", "--checkpoint", str(FIXTURE / "best.pt"), "--input",
        "data/nq-sample/simplified-nq-test.jsonl", "--output", str(submission), "--nq-cache-dir", str(cache))
    assert submission.read_bytes() == (FIXTURE / "expected-submission.csv").read_bytes()
    evaluated = run("distqa.evaluate", "--checkpoint", str(FIXTURE / "best.pt"), "--nq-cache-dir", str(cache))
    assert_close_values(json.loads(evaluated.stdout), json.loads((FIXTURE / "expected-evaluation.json").read_text()))
