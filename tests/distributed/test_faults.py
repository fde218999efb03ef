"""Fault injection (distqa.training.faults, INJECT_FAULT) through the trainer on 2 ranks: a killed worker restarted by
torchrun resumes to the weights of an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.compare import final_weights, max_difference
from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT, WORKER
from support.shared_runs import forty_steps_of_2_ranks, forty_steps_uninterrupted


def test_a_worker_killed_at_a_step_is_restarted_and_the_run_ends_as_if_uninterrupted(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Through the trainer, worker.sh --max-restarts 1: rank 1 is SIGKILLed after step 7, torchrun restarts both
    workers, they resume from step 7, which rank 0 saved when it lost its peer (past step 5's checkpoint), the fault
    does not fire again, and the weights equal those of a run never interrupted (dropout on; the session's run of
    support.shared_runs.forty_steps_of_2_ranks, shared with test_training.py and test_node_loss.py)."""
    args = [*MACHINERY_ARGS, *forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "5", "--output-dir",
            str(tmp_path)]
    result = subprocess.run(  # worker.sh: one node, 2 processes, torchrun as every launcher starts it
        ["bash", WORKER, "--nproc-per-node", "2", "--max-restarts", "1", "--run-id", "killed", "--", *args],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", INJECT_FAULT="kill:rank=1:step=7"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    logs = {rank: (tmp_path / "killed" / "logs" / f"rank-{rank}.log").read_text() for rank in (0, 1)}
    assert logs[1].count("fault injection (INJECT_FAULT): kill rank 1 after step 7 now") == 1
    assert "done already in this run directory" in logs[1], "the restarted worker knew"
    assert "after step 7 now" not in logs[0], "rank 0 is untouched"
    # Rank 0 lost its peer after step 7 and saved it, the last step both completed (distqa.training.peer_loss).
    assert f"resumed from {tmp_path / 'killed' / 'checkpoints' / 'step-00000007.pt'}" in logs[0] + logs[1]

    uninterrupted = forty_steps_uninterrupted(tmp_path_factory)
    difference = max_difference(final_weights(uninterrupted), final_weights(tmp_path / "killed"))
    assert difference < 1e-6, f"the run killed at step 7 and restarted differs by {difference:.2e}"
