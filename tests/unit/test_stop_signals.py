"""A graceful stop's signals (distqa.distributed.stop): a second one ends a worker at once, unless the scheduler
signals every process of the step (WORKER_STEP_SIGNALS=1, scripts/train_slurm.sbatch), where the agent's own
SIGTERM, passed on a moment after Slurm's, is the same stop."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from support.processes import clean_env
from support.repo import REPO_ROOT

TWO_SIGTERMS = """
import os, signal, torch
from distqa.distributed.stop import StopSignal

stop = StopSignal(torch.device("cpu"), every=1)
with stop.installed():
    os.kill(os.getpid(), signal.SIGTERM)  # Slurm's, to every process of the step
    os.kill(os.getpid(), signal.SIGTERM)  # the agent's, passed on
    print("still here, stopping on", signal.Signals(stop.agreed(1)).name, flush=True)
"""


@pytest.mark.parametrize(("step_signals", "ends"), [("1", "at the step"), ("", "at once")])
def test_a_second_sigterm_is_the_same_stop_only_where_the_step_is_signalled(step_signals: str, ends: str) -> None:
    result = subprocess.run([sys.executable, "-c", TWO_SIGTERMS], cwd=REPO_ROOT, capture_output=True, text=True,
                            env=clean_env(WORKER_STEP_SIGNALS=step_signals), timeout=120)
    if ends == "at the step":
        assert result.returncode == 0, result.stderr
        assert result.stdout == "still here, stopping on SIGTERM\n"
    else:
        assert result.returncode == -signal.SIGTERM and result.stdout == "", (result.returncode, result.stdout)
