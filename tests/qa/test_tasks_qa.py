"""The task seam with the registered QA tasks: a registered name and its import path are one task, another task's
settings are ignored in the environment and refused as flags, FAST_ARGS is a dummy-task run, and prepare alone
prepares the default task (the seam itself: tests/unit/test_tasks.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config import Config, ConfigError
from distqa.config.sources import load_config
from distqa.tasks import task_class

from support.processes import clean_env
from support.qa import FAST_ARGS
from support.repo import REPO_ROOT

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def load(*argv: str, environ: dict[str, str] | None = None, dotenv: Path | None = None) -> Config:
    return load_config(list(argv), environ=environ or {}, dotenv_path=dotenv or Path("/nonexistent/.env"))


def test_registered_tasks_and_an_import_path_resolve_to_the_same_class() -> None:
    assert task_class("nq") is task_class("distqa.qa.nq.task:NQTask")
    assert load("--task", "nq").task == "nq"
    config = load("--task", "examples.text_classification.task:TextClassification")
    assert type(config).__name__ == "TextClassificationConfig" and config.data_file.endswith("reviews.tsv")


def test_settings_of_another_task_in_the_environment_are_ignored_and_as_flags_refused() -> None:
    assert load(environ={"DISTQA_NQ_CACHE_DIR": "/elsewhere"}).task == "dummy"  # a .env serving both tasks
    with pytest.raises(ConfigError, match="environment variable DISTQA_NO_SUCH_SETTING is not a setting"):
        load(environ={"DISTQA_NO_SUCH_SETTING": "1"})
    with pytest.raises(ConfigError, match=re.escape("--dummy-size is a setting of task 'dummy', not of task 'nq': "
                                                    "add --task dummy, or leave the flag out.")):
        load("--task", "nq", "--dummy-size", "8")


def test_the_qa_tasks_small_configuration_is_a_dummy_task_run() -> None:
    assert load(*FAST_ARGS).task == "dummy"


def test_prepare_alone_prepares_the_default_task_which_builds_nothing(tmp_path: Path) -> None:
    """``python -m distqa.prepare`` chooses the task as train does (dummy by default), not NQ: one line, no cache."""
    result = subprocess.run([sys.executable, "-m", "distqa.prepare"], cwd=REPO_ROOT, capture_output=True, text=True,
                            env=clean_env(DISTQA_NQ_CACHE_DIR=str(tmp_path / "cache")), timeout=120)
    assert result.returncode == 0, result.stderr
    assert not result.stdout and not (tmp_path / "cache").exists()
    assert "task 'dummy' has nothing to build before training" in result.stderr and "--task" in result.stderr
