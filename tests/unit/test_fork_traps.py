"""What a fork's own task met that the built-in tasks never did (issue 31, part 7), with the tasks of
tests/support/fork_tasks.py imported from outside the package: buffers broadcast unless the task opts out, data
built before training by a task that declares no prepare sections, and presets that apply only to the tasks they
are for (the BatchNorm statistics on 2 ranks: tests/distributed/test_fork_traps.py; the QA tasks' buffers and presets:
tests/qa/test_fork_traps_qa.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from torch.nn.parallel import DistributedDataParallel

from distqa.config import Config, ConfigError
from distqa.config.sources import load_config
from distqa.distributed.ddp import training_module
from distqa.distributed.runtime import local_runtime
from distqa.tasks import task_class

from support.fork_tasks import FORK_ENV, RUN_ARGS, BatchNormMLP
from support.processes import clean_env
from support.repo import REPO_ROOT

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(*argv: str, environ: dict[str, str] | None = None) -> Config:
    return load_config(list(argv), environ=environ or {}, dotenv_path=Path("/nonexistent/.env"))


# --- buffers -------------------------------------------------------------------------------------------

def test_ddp_broadcasts_the_buffers_before_each_forward_unless_the_task_opts_out(group_of_one: None) -> None:
    """What distqa.train wraps (DDP over a group of one, as for 2 ranks): torch's default, forward_sync_buffers,
    for a task that keeps it; none for one that opts out, as the QA tasks do (tests/qa/test_fork_traps_qa.py)."""
    config = load("--task", "support.fork_tasks:Regression", "--preset", "none")
    runtime = dataclasses.replace(local_runtime("cpu"), world_size=2)  # wrapped only when distributed
    for task, syncs in [("support.fork_tasks:Regression", True), ("support.fork_tasks:UnsyncedRegression", False)]:
        wrapped = training_module(BatchNormMLP(), runtime, config, task_class(task).sync_buffers)
        assert isinstance(wrapped, DistributedDataParallel) and wrapped.will_sync_module_buffers() is syncs, task


# --- data built before training ------------------------------------------------------------------------

def test_a_task_that_builds_data_and_declares_no_prepare_sections_gets_it_built(tmp_path: Path) -> None:
    """`prepare --only-if-needed` with the training command line, as scripts/run_distributed_locally.sh runs it
    before any rank starts: build_data alone says whether there is something to build."""
    assert not task_class("support.fork_tasks:BuiltRegression").prepare_sections
    data = tmp_path / "data"
    result = subprocess.run([sys.executable, "-m", "distqa.prepare", "--only-if-needed", "--run-name", "built",
                             "--task", "support.fork_tasks:BuiltRegression", "--data-dir", str(data), *RUN_ARGS],
                            cwd=REPO_ROOT, env=clean_env(**FORK_ENV), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(data) and (data / "samples.pt").is_file()


# --- presets -------------------------------------------------------------------------------------------

def test_a_preset_that_names_no_tasks_is_for_any_and_a_wrong_tasks_key_is_named(tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text("lr = 1e-3\n")
    assert load("--preset", str(preset), "--task", "support.fork_tasks:Regression").lr == 1e-3
    preset.write_text('tasks = "nq"\n')
    with pytest.raises(ConfigError, match=r"tasks must be a list of task names, such as tasks = \[\"mytask\"\]"):
        load("--preset", str(preset))
    preset.write_text('tasks = ["squad"]\ntask = "nq"\n')
    with pytest.raises(ConfigError, match=r"its task 'nq' is not one of its tasks \['squad'\]; add it there"):
        load("--preset", str(preset))
