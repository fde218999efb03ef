"""The QA tasks' shape: their shared types and metrics import no torch, choosing one loads no model code until a
model is built, and each entry point shows and accepts only its own settings, each QA task's (the package's shape:
tests/unit/test_structure.py)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from distqa import prepare
from distqa.config import ConfigError, fields_of
from distqa.config.flags import (
    build_arg_parser,
    coerce_flag,
    ordered_sections,
    prepare_sections,
    section_fields,
    train_sections,
)
from distqa.qa.nq.config import NQConfig
from distqa.tasks import REGISTERED, task_class

from support.processes import clean_env
from support.repo import REPO_ROOT


def test_the_qa_tasks_shared_types_and_metrics_import_no_torch() -> None:
    """The answers, the NQ metric (which `score` runs on machines without a GPU stack) and the prepared-cache lookup
    stay importable without torch."""
    code = ("import sys; import distqa.qa.answers, distqa.qa.nq.metric, distqa.qa.nq.prepared; "
            "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); print(heavy); sys.exit(bool(heavy))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_qa_tasks_import_their_model_side_only_to_build_a_model() -> None:
    """Choosing a QA task, and preparing its data, loads neither transformers' modeling code nor torch's compiler
    (seconds of imports in every ``distqa.prepare`` the local launcher runs before a run, and in each featurising
    process); building the model loads them."""
    code = ("import sys; from distqa.tasks import task_class; "
            "[task_class(name) for name in ('dummy', 'nq', 'squad')]; "
            "model_side = ('transformers.modeling_utils', 'torch._dynamo', 'distqa.qa.model', 'distqa.qa.inference'); "
            "print(sorted(set(model_side) & set(sys.modules))); "
            "from distqa.config.sources import load_config; from distqa.tasks import make_task; "
            "make_task(load_config(['--task', 'dummy'])).build_model(); "
            "print(sorted(set(model_side[:3]) & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "[]", "['distqa.qa.model', 'torch._dynamo', 'transformers.modeling_utils']"], result.stdout


# --- each entry point shows and accepts only its own settings --------------------------------------

def setting_flags(names: Iterable[str]) -> set[str]:
    return {"--" + name.replace("_", "-") for name in names}


ALL_SETTINGS = set().union(*(fields_of(task_class(task).config_class) for task in REGISTERED))
ALL_SECTIONS = ordered_sections(f.metadata["section"] for task in REGISTERED
                                for f in fields_of(task_class(task).config_class).values())
"""The machinery's sections and every registered task's own."""


def flags_in(help_text: str) -> set[str]:
    """The settings' flags a --help text shows."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) & setting_flags(ALL_SETTINGS)


@pytest.mark.parametrize("task", REGISTERED)
def test_train_shows_every_setting_of_its_task_in_its_sections(task: str) -> None:
    """`train --task T --help` shows exactly T's settings, section by section (another task's sections not)."""
    chosen = task_class(task)
    help_text = build_arg_parser(task=chosen).format_help()
    assert flags_in(help_text) == setting_flags(fields_of(chosen.config_class))
    for section in ALL_SECTIONS:
        assert (f"\n{section.title}:\n" in help_text) == (section in train_sections(chosen)), section.title


@pytest.mark.usefixtures("no_torchrun_env")
def test_prepare_shows_and_accepts_only_what_determines_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m distqa.prepare``'s main (the module exits with what it returns), in this process."""
    with pytest.raises(SystemExit) as shown:
        prepare.main(["--task", "nq", "--help"])
    help_text = capsys.readouterr().out
    assert shown.value.code == 0
    assert flags_in(help_text) == setting_flags(section_fields(prepare_sections(task_class("nq")), NQConfig))
    assert "--lr" not in help_text and "--global-batch-size" not in help_text
    with pytest.raises(SystemExit) as refused:
        prepare.main(["--task", "nq", "--lr", "1e-4"])
    assert refused.value.code == 2 and "unrecognized arguments: --lr" in capsys.readouterr().err
    # A training command line is what the launchers pass with --only-if-needed: a run on the DummyDataset
    # needs no features, so this prepares nothing, and the trainer's flags are accepted (and the environment
    # may hold another task's settings).
    monkeypatch.setenv("DISTQA_NQ_CACHE_DIR", str(tmp_path / "cache"))
    assert prepare.main(["--only-if-needed", "--lr", "1e-4"]) == 0
    assert not capsys.readouterr().out and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("module", ["distqa.qa.commands.predict", "distqa.qa.commands.evaluate"])
def test_predict_and_evaluate_show_only_the_settings_they_take_from_flags(module: str) -> None:
    """The rest comes from the checkpoint; the flags they have are the settings' own (same help, same types).
    The QA tasks' commands, which ``python -m distqa.predict|evaluate`` run for their checkpoints."""
    entry_point = importlib.import_module(module)
    help_text = entry_point.build_arg_parser().format_help()
    taken_from_flags = tuple(dict.fromkeys(name for names in entry_point.SETTINGS.values() for name in names))
    assert flags_in(help_text) == setting_flags(taken_from_flags)
    assert "--batch-size" in help_text  # the short name, kept for eval_batch_size
    with pytest.raises(ConfigError, match="eval_batch_size: invalid value 'many' from flag --eval-batch-size"):
        coerce_flag("eval_batch_size", "many", NQConfig)
