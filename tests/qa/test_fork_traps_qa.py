"""The fork traps with the QA tasks (tests/unit/test_fork_traps.py has the fork's own tasks): their encoders' buffers
are constants, so they opt out of DDP's broadcast; the QA presets apply only to the tasks they name, are refused for
another, and every shipped preset loads for each of its tasks."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distqa.config import Config, ConfigError, fields_of
from distqa.config.presets import read_preset
from distqa.config.sources import load_config
from distqa.qa.model import build_model
from distqa.tasks import REGISTERED, task_class

from support.processes import clean_env
from support.qa import TinyEncoder
from support.repo import REPO_ROOT

pytestmark = pytest.mark.usefixtures("no_torchrun_env")
FORK_ENV = {"PYTHONPATH": str(REPO_ROOT / "tests"), "OMP_NUM_THREADS": "1"}


def load(*argv: str, environ: dict[str, str] | None = None) -> Config:
    return load_config(list(argv), environ=environ or {}, dotenv_path=Path("/nonexistent/.env"))


def test_the_qa_tasks_opt_out_because_their_encoders_buffers_are_constants(tiny_encoder: TinyEncoder) -> None:
    """Every encoder family's buffers (position ids, rotary frequencies) are outside the state dict and unchanged
    by a training step: there is nothing for DDP to broadcast, so the QA tasks declare sync_buffers = False."""
    assert [name for name in REGISTERED if task_class(name).sync_buffers] == []
    config = load("--preset", "none", "--model-name-or-path", str(tiny_encoder.directory), "--from-scratch", "true")
    model = build_model(config)
    before = {name: buffer.clone() for name, buffer in model.named_buffers()}
    assert before and not set(before) & set(model.state_dict())  # not persistent: never in a checkpoint
    encoded = tiny_encoder.tokenizer(["what is it"], ["it is a test of the buffers"], return_tensors="pt")
    model.train()
    output = model.encoder(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
    output.last_hidden_state.square().mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(torch.equal(buffer, before[name]) for name, buffer in model.named_buffers())


def test_the_default_preset_applies_only_to_the_tasks_it_is_for(caplog: pytest.LogCaptureFixture) -> None:
    tiny_cpu = read_preset("tiny-cpu")
    for task in ("dummy", "nq", "squad"):
        assert load("--task", task).preset == "tiny-cpu"
    assert load().lr == tiny_cpu.values["lr"] and load().checkpoint_every == tiny_cpu.values["checkpoint_every"]
    with caplog.at_level(logging.WARNING, logger="distqa.config.sources"):
        config = load("--task", "support.fork_tasks:Regression")
    # The fork's run: the built-in defaults, recorded as such, and nothing said about other tasks' settings.
    defaults = {name: f.default for name, f in fields_of(type(config)).items() if name not in ("preset", "task")}
    assert config.preset == "none" and {name: getattr(config, name) for name in defaults} == defaults
    assert [r.getMessage() for r in caplog.records] == []


def test_a_preset_given_for_another_task_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        load("--preset", "tiny-cpu", "--task", "support.fork_tasks:Regression")
    assert str(refused.value) == ("--preset tiny-cpu: this preset is for task dummy and nq and squad, not for this "
                                  "run's task 'support.fork_tasks:Regression'; choose a preset for that task, or "
                                  "--preset none for the built-in defaults.")
    with pytest.raises(ConfigError, match=r"^DISTQA_PRESET tiny-squad: this preset is for task squad, not for this "
                                          r"run's task 'dummy'; "):
        load("--task", "dummy", environ={"DISTQA_PRESET": "tiny-squad"})
    # A registered name and its import path are one task.
    assert load("--preset", "tiny-squad", "--task", "distqa.qa.squad.task:SquadTask").preset == "tiny-squad"


def test_a_train_run_of_another_task_with_a_preset_stops_before_anything_starts() -> None:
    result = subprocess.run([sys.executable, "-m", "distqa.train", "--preset", "tiny-synthetic-squad", "--task", "nq"],
                            cwd=REPO_ROOT, env=clean_env(**FORK_ENV), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == ("distqa.train: configuration error: --preset tiny-synthetic-squad: this preset "
                                     "is for task squad, not for this run's task 'nq'; choose a preset for that task, "
                                     "or --preset none for the built-in defaults.")


def test_every_shipped_preset_names_its_tasks_and_loads_for_each(tmp_path: Path) -> None:
    downloaded = tmp_path / "simplified-nq-train.jsonl"  # the real data is not in the repository
    downloaded.touch()
    for path in sorted((REPO_ROOT / "configs").glob("*.toml")):
        preset = read_preset(path.stem)
        assert preset.tasks and set(preset.tasks) <= set(REGISTERED), path
        for task in preset.tasks:
            assert load("--preset", path.stem, "--task", task,
                        environ={"DISTQA_NQ_TRAIN_FILE": str(downloaded)}).preset == path.stem
