"""What a fork's own task met that the built-in tasks never did (issue 31, part 7), on 2 ranks with the tasks of
tests/support/fork_tasks.py imported from outside the package: BatchNorm statistics that must be rank 0's on every
rank and in the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.run_folder import checkpoint_path

from support.fork_tasks import FORK_ENV, RUN_ARGS
from support.processes import clean_env
from support.runs import run_training

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


# --- buffers -------------------------------------------------------------------------------------------

def statistics_seen(tmp_path: Path, task: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], str, dict]:
    """A 2-rank run of ``task``: each rank's running statistics at the last evaluation, the last checkpoint's
    model, the run's console output, and the run's saved config."""
    result = run_training(["--task", f"support.fork_tasks:{task}", "--output-dir", str(tmp_path), *RUN_ARGS], nproc=2,
                          env=clean_env(**FORK_ENV))
    run_dir = tmp_path / "local"
    checkpoint = torch.load(checkpoint_path(run_dir, 6), map_location="cpu", weights_only=True)
    assert checkpoint["evaluation"]["step"] == 6  # the statistics were gathered after the last step
    config = json.loads((run_dir / "config.json").read_text())
    return checkpoint["task_state"]["running_statistics"], checkpoint["model"], result.stdout + result.stderr, config


def test_batchnorm_statistics_are_rank_0s_on_every_rank_and_in_the_checkpoint(tmp_path: Path) -> None:
    """By default (DDP's own), every rank evaluates rank 0's running statistics, which the checkpoint holds."""
    seen, model, output, config = statistics_seen(tmp_path / "synced", "Regression")
    in_checkpoint = torch.cat([model["norm.running_mean"], model["norm.running_var"]])
    assert torch.equal(seen[0], in_checkpoint) and torch.equal(seen[1], in_checkpoint)
    # The ranks' shares do differ: a task that opts out keeps each rank's own statistics.
    unsynced, _, _, _ = statistics_seen(tmp_path / "unsynced", "UnsyncedRegression")
    assert not torch.equal(unsynced[0], unsynced[1])
    # No preset of another task reached this run, and none of its settings was announced.
    assert config["preset"] == "none" and "a setting of task" not in output
