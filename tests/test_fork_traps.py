"""What a fork's own task met that the built-in tasks never did (issue 31, part 7), with the tasks of
tests/fork_tasks.py imported from outside the package: BatchNorm statistics that must be rank 0's on every rank
and in the checkpoint, data built before training by a task that declares no prepare sections, and presets that
apply only to the tasks they are for (the QA tasks' buffers and presets: tests/qa/test_fork_traps_qa.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from distqa.checkpoint.run_folder import checkpoint_path
from distqa.config import Config, ConfigError
from distqa.distributed.runtime import local_runtime
from distqa.parallel.ddp import training_module
from distqa.settings.sources import load_config
from distqa.tasks import task_class

from conftest import REPO_ROOT, clean_env, run_training
from fork_tasks import BatchNormMLP

pytestmark = pytest.mark.usefixtures("no_torchrun_env")
TESTS = str(REPO_ROOT / "tests")
FORK_ENV = {"PYTHONPATH": TESTS, "OMP_NUM_THREADS": "1"}
RUN_ARGS = ["--global-batch-size", "16", "--per-rank-batch-size", "8", "--lr", "1e-2", "--max-steps", "6",
            "--eval-every", "3", "--progress-bar", "false", "--tensorboard", "false"]


def load(*argv: str, environ: dict[str, str] | None = None) -> Config:
    return load_config(list(argv), environ=environ or {}, dotenv_path=Path("/nonexistent/.env"))


# --- buffers -------------------------------------------------------------------------------------------

def statistics_seen(tmp_path: Path, task: str) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], str, dict]:
    """A 2-rank run of ``task``: each rank's running statistics at the last evaluation, the last checkpoint's
    model, the run's console output, and the run's saved config."""
    result = run_training(["--task", f"fork_tasks:{task}", "--output-dir", str(tmp_path), *RUN_ARGS], nproc=2,
                          env=clean_env(**FORK_ENV))
    run_dir = tmp_path / "local"
    checkpoint = torch.load(checkpoint_path(run_dir, 6), map_location="cpu", weights_only=True)
    assert checkpoint["evaluation"]["step"] == 6  # the statistics were gathered after the last step
    config = json.loads((run_dir / "config.json").read_text())
    return checkpoint["task_state"]["running_statistics"], checkpoint["model"], result.stdout + result.stderr, config


@pytest.mark.distributed
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


def test_ddp_broadcasts_the_buffers_before_each_forward_unless_the_task_opts_out(group_of_one: None) -> None:
    """What distqa.train wraps (DDP over a group of one, as for 2 ranks): torch's default, forward_sync_buffers,
    for a task that keeps it; none for one that opts out, as the QA tasks do (tests/qa/test_fork_traps_qa.py)."""
    config = load("--task", "fork_tasks:Regression", "--preset", "none")
    runtime = dataclasses.replace(local_runtime("cpu"), world_size=2)  # wrapped only when distributed
    for task, syncs in [("fork_tasks:Regression", True), ("fork_tasks:UnsyncedRegression", False)]:
        wrapped = training_module(BatchNormMLP(), runtime, config, task_class(task).sync_buffers)
        assert isinstance(wrapped, DistributedDataParallel) and wrapped.will_sync_module_buffers() is syncs, task


# --- data built before training ------------------------------------------------------------------------

def test_a_task_that_builds_data_and_declares_no_prepare_sections_gets_it_built(tmp_path: Path) -> None:
    """`prepare --only-if-needed` with the training command line, as scripts/run_distributed_locally.sh runs it
    before any rank starts: build_data alone says whether there is something to build."""
    assert not task_class("fork_tasks:BuiltRegression").prepare_sections
    data = tmp_path / "data"
    result = subprocess.run([sys.executable, "-m", "distqa.prepare", "--only-if-needed", "--run-name", "built",
                             "--task", "fork_tasks:BuiltRegression", "--data-dir", str(data), *RUN_ARGS],
                            cwd=REPO_ROOT, env=clean_env(**FORK_ENV), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(data) and (data / "samples.pt").is_file()


# --- presets -------------------------------------------------------------------------------------------

def test_a_preset_that_names_no_tasks_is_for_any_and_a_wrong_tasks_key_is_named(tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text("lr = 1e-3\n")
    assert load("--preset", str(preset), "--task", "fork_tasks:Regression").lr == 1e-3
    preset.write_text('tasks = "nq"\n')
    with pytest.raises(ConfigError, match=r"tasks must be a list of task names, such as tasks = \[\"nq\"\]"):
        load("--preset", str(preset))
    preset.write_text('tasks = ["squad"]\ntask = "nq"\n')
    with pytest.raises(ConfigError, match=r"its task 'nq' is not one of its tasks \['squad'\]; add it there"):
        load("--preset", str(preset))
