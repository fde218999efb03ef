"""The task seam: choosing a task (a registered name or a fork's import path) and what a wrong choice says;
a fork's settings declared wrongly (the registered QA tasks' names and another task's
settings: tests/qa/test_tasks_qa.py); run-defining marks that name several tasks (a fork's settings stopping a
resume and its entry module on every node: tests/distributed/test_tasks.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from distqa.config import OPTIMISATION, Config, ConfigError, Section
from distqa.config.sources import load_config
from distqa.tasks.base import Task

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, MACHINERY_TASK, REPO_ROOT
from support.runs import train

pytestmark = pytest.mark.usefixtures("no_torchrun_env")
MINE = Section("mine", "a test task")


def load(*argv: str, environ: dict[str, str] | None = None, dotenv: Path | None = None) -> Config:
    return load_config(list(argv), environ=environ or {}, dotenv_path=dotenv or Path("/nonexistent/.env"))


# --- choosing a task ---------------------------------------------------------------------------------

@pytest.fixture
def broken_package(tmp_path: Path) -> Path:
    """A package of a fork's tasks that fail in the ways a fork's can: raising or not parsing on import."""
    package = tmp_path / "forkpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "raises.py").write_text("import json\nSETTING = json.loads('{')\n")
    (package / "bad_syntax.py").write_text("def broken(:\n    pass\n")
    (package / "not_a_task.py").write_text("class Reader:\n    pass\n")
    return tmp_path


@pytest.mark.parametrize(("task", "said"), [
    ("nosuch", "task 'nosuch' is not a registered task (dummy, nq, squad); a fork's own task is given as "
               "package.module:ClassName (docs/FORKING.md)."),
    ("forkpkg.missing:Task", "task 'forkpkg.missing:Task': no module named 'forkpkg.missing' on the Python path"),
    ("forkpkg.raises:Task", "task 'forkpkg.raises:Task': importing forkpkg.raises failed: JSONDecodeError: "),
    ("forkpkg.bad_syntax:Task", "task 'forkpkg.bad_syntax:Task': importing forkpkg.bad_syntax failed: SyntaxError: "),
    ("forkpkg.not_a_task:Reader", "Reader in forkpkg.not_a_task is a class, not a subclass of Task"),
    ("forkpkg.not_a_task:Nothing", "Nothing in forkpkg.not_a_task is not defined"),
])
def test_a_task_that_cannot_be_used_is_one_line_and_exit_2(task: str, said: str, broken_package: Path) -> None:
    result = train("--task", task, env=clean_env(PYTHONPATH=str(broken_package)))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("distqa.train: configuration error: ") and said in line, line
    assert "process group" not in result.stderr and "rank 0" not in result.stderr  # before any process group
    if "raises" in task or "bad_syntax" in task:  # where it failed, as file:line
        assert str(broken_package / "forkpkg") in line


# --- a fork's settings declared wrongly ----------------------------------------------------------------

@dataclass
class NoSectionConfig(Config):
    threshold: float = 0.5


@dataclass
class ListConfig(Config):
    sizes: list[int] = MINE((), "Sizes.")  # noqa: RUF009 -- the unsupported type is what this test is about


@dataclass
class WrongDefaultConfig(Config):
    words: int = MINE("many", "Words per text.")


@dataclass
class RetypedConfig(Config):
    lr: int = OPTIMISATION(1, "A learning rate that is a whole number.")  # type: ignore[assignment]


@dataclass
class StringMarkConfig(Config):
    source: str = MINE("a.tsv", "Where the data is.", defines_run="mine")  # type: ignore[arg-type]


@dataclass
class GoodConfig(Config):
    words: int = MINE(8, "Words per text.", defines_run=True)
    kind: Literal["a", "b"] = MINE("a", "Which kind.", defines_run=("good", "other"))


def a_task(config_class: type[Config], name: str = "mine") -> type[Task]:
    return type(f"{config_class.__name__}Task", (Task,), {"name": name, "config_class": config_class})


NoSection, Listed, WrongDefault, Retyped, StringMark, Good = (
    a_task(c) for c in (NoSectionConfig, ListConfig, WrongDefaultConfig, RetypedConfig, StringMarkConfig, GoodConfig))
NotAConfig = type("NotAConfig", (Task,), {"config_class": dict})


@pytest.mark.parametrize(("task", "said"), [
    ("NoSection", "setting 'threshold' of unit.test_tasks.NoSectionConfig has no section or no help text; declare it "
                  "as MY_SECTION(default, 'what it means') with a distqa.config.Section"),
    ("Listed", "setting 'sizes' of unit.test_tasks.ListConfig has the type list[int], which settings cannot have; "
               "use str, int, float, bool, a Literal of strings, or one of them | None."),
    ("WrongDefault", "setting 'words' of unit.test_tasks.WrongDefaultConfig: its default 'many' is not of its type"),
    ("Retyped", "setting 'lr' of unit.test_tasks.RetypedConfig redefines Config's lr with another type"),
    ("StringMark", "setting 'source' of unit.test_tasks.StringMarkConfig: defines_run must be True, False or a tuple"),
    ("NotAConfig", "NotAConfig.config_class must be a dataclass that extends distqa.config.Config"),
])
def test_a_setting_declared_wrongly_is_named_with_the_fix(task: str, said: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load("--task", f"unit.test_tasks:{task}")
    assert said in str(raised.value)


def test_a_forks_settings_come_from_flags_variables_and_presets_and_are_run_defining(tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text('task = "unit.test_tasks:Good"\nwords = 12\n')
    config = load("--preset", str(preset), "--kind", "b", environ={"DISTQA_LR": "0.002"})
    assert (config.task, config.words, config.kind, config.lr) == ("unit.test_tasks:Good", 12, "b", 0.002)
    assert {"words", "task"} <= set(config.run_defining())
    # A mark that names tasks defines the run of those tasks only (the task is known by what --task says).
    marked = GoodConfig(task="good")
    assert "kind" in marked.run_defining() and "kind" not in GoodConfig(task="third").run_defining()
    help_text = subprocess.run([sys.executable, "-m", "distqa.train", "--task", "unit.test_tasks:Good", "--help"],
                               cwd=REPO_ROOT / "tests", env=clean_env(), capture_output=True, text=True,
                               timeout=120).stdout
    assert "\na test task:\n" in help_text and "--words INT" in help_text and "--dummy-size" not in help_text


@dataclass
class HookedConfig(Config):
    """A fork's settings with rules of their own: a source-dependent value and a check of the machine."""

    words: int = MINE(8, "Words per text.")
    data_dir: str = MINE("", "Where the data is; must exist on the machine when given.")

    @classmethod
    def settle_sources(cls, values: dict, set_later: set[str], preset_values: dict, preset_path: Path | None) -> None:
        super().settle_sources(values, set_later, preset_values, preset_path)
        if "words" in preset_values and "words" not in set_later:  # the preset's words count double
            values["words"] *= 2

    def check_machine(self) -> None:
        super().check_machine()
        if self.data_dir and not Path(self.data_dir).is_dir():
            raise ConfigError(f"data_dir: {self.data_dir} is not a directory here")


Hooked = a_task(HookedConfig)


def test_a_forks_settings_class_brings_its_own_source_and_machine_rules(tmp_path: Path) -> None:
    """load_config knows no task: a settings class's hooks see which source set a value, and check the machine."""
    preset = tmp_path / "hooked.toml"
    preset.write_text('task = "unit.test_tasks:Hooked"\nwords = 5\n')
    assert load("--preset", str(preset)).words == 10
    assert load("--preset", str(preset), "--words", "5").words == 5  # a flag's value is taken as given
    assert load("--task", "unit.test_tasks:Hooked", "--data-dir", str(tmp_path)).data_dir == str(tmp_path)
    with pytest.raises(ConfigError, match=r"data_dir: .*missing is not a directory here"):
        load("--task", "unit.test_tasks:Hooked", "--data-dir", str(tmp_path / "missing"))


def test_the_suites_small_configuration_is_the_machinery_task() -> None:
    """MACHINERY_ARGS (what the tests of distribution, faults, launchers, checkpoints and tracking start) is the
    example fork's task (FAST_ARGS, the QA tasks' own: tests/qa/test_tasks_qa.py)."""
    assert load(*MACHINERY_ARGS).task == MACHINERY_TASK


# --- a fork that deleted the QA package -------------------------------------------------------------------

EXAMPLE_TASK = "examples.text_classification.task:TextClassification"


@pytest.fixture(scope="module")
def without_qa(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fork's checkout: the package without distqa/qa, and the example task, without the presets (QA ones), and
    the environment that imports distqa from it."""
    root = tmp_path_factory.mktemp("fork")
    shutil.copytree(REPO_ROOT / "src" / "distqa", root / "src" / "distqa",
                    ignore=lambda folder, names: [n for n in names if n == "__pycache__" or
                                                  (n == "qa" and Path(folder).name == "distqa")])
    shutil.copytree(REPO_ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (root / "src" / "distqa" / "qa").exists() and not (root / "configs").exists()
    return root, clean_env(PYTHONPATH=os.pathsep.join([str(root / "src"), str(root)]))


def test_a_fork_without_the_qa_package_shows_its_settings(without_qa: tuple[Path, dict[str, str]]) -> None:
    """The registry, the settings and --help import only the task in use: the registered tasks whose package is gone
    are left out, a flag that is no setting of the run's is refused as argparse refuses it, and .env.example lists
    what is here."""
    root, env = without_qa

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)

    shown = run("-m", "distqa.train", "--task", EXAMPLE_TASK, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "--data-file" in shown.stdout and "--max-seq-len" not in shown.stdout
    assert "registered: none here" in " ".join(shown.stdout.split())
    refused = run("-m", "distqa.train", "--task", EXAMPLE_TASK, "--nq-cache-dir", "x")
    assert refused.returncode == 2 and "unrecognized arguments: --nq-cache-dir x" in refused.stderr
    example = run("-m", "distqa.config.sources")
    assert example.returncode == 0 and "DISTQA_LR=" in example.stdout
    assert "DISTQA_MODEL_NAME_OR_PATH" not in example.stdout
    for result in (shown, refused, example):
        assert "Traceback" not in result.stderr, result.stderr


def test_a_fork_without_the_qa_package_runs_the_doctor(without_qa: tuple[Path, dict[str, str]]) -> None:
    root, env = without_qa
    result = subprocess.run([sys.executable, "-m", "distqa.doctor", "--task", EXAMPLE_TASK], cwd=root, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "memory: not estimated (task 'text_classification' defines no training_memory)" in result.stdout
    assert "doctor: all checks passed on 1 rank(s)" in result.stdout
