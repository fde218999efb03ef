"""The doctor of a QA task's run: a missing NQ feature cache fails with the command that builds it, and the task's
memory estimate is shown for this machine (the doctor itself: tests/distributed/test_doctor.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.processes import clean_env
from support.repo import REPO_ROOT

DOCTOR = [sys.executable, "-m", "distqa.doctor", "--progress-bar", "false"]


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DOCTOR, *args], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=120)


def failures(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]


def test_a_missing_feature_cache_fails_with_the_command_that_builds_it(tmp_path: Path) -> None:
    result = doctor("--output-dir", str(tmp_path / "results"), "--task", "nq", "--nq-cache-dir",
                    str(tmp_path / "no-cache"))
    assert result.returncode == 1, result.stdout + result.stderr
    [failure] = failures(result)
    assert "feature cache: no NQ feature cache" in failure and "`python -m distqa.prepare`" in failure
    # The QA task's memory estimate, on CPU (its GPU figures: tests/qa/test_memory.py).
    assert "\nmemory per rank: " in result.stdout
    assert "on CPU (distqa.encoders.memory); --gpu-memory-gb N" in result.stdout
