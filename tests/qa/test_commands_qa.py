"""The QA tasks' commands through the dispatch: each task's class names its own module (nq's serves the dummy task
too), which a checkpoint of the task reaches, and nothing behind the dispatch asks the task's name again; scoring an NQ
or SQuAD file runs what their classes declare, with neither torch nor transformers (the dispatch itself:
tests/unit/test_commands.py)."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from distqa import evaluate, predict
from distqa.checkpoint.format import ModelCheckpoint, Progress
from distqa.config.registry import LIGHT_COMMANDS
from distqa.qa.nq import commands as nq_commands
from distqa.qa.squad import commands as squad_commands
from distqa.tasks import task_class
from distqa.tasks.commands import task_command

from support.processes import clean_env
from support.repo import REPO_ROOT

QA = REPO_ROOT / "src" / "distqa" / "qa"
COMMANDS_MODULES = {"dummy": "distqa.qa.nq.commands", "nq": "distqa.qa.nq.commands",
                    "squad": "distqa.qa.squad.commands"}
"""The module of each QA task's predict, evaluate and score (dummy checkpoints are NQ-shaped)."""


def test_each_qa_task_names_its_own_commands_module() -> None:
    for task, module in COMMANDS_MODULES.items():
        assert task_class(task).commands == {"predict": f"{module}:predict", "evaluate": f"{module}:evaluate",
                                             "score": f"{module}:score", "export": "distqa.qa.commands.export:main"}
        for command in task_class(task).commands:
            assert callable(task_command(task, command))


def a_checkpoint_of(task: str, path: Path) -> Path:
    """A best.pt whose config names ``task`` (all the dispatch and the commands' first steps read), no weights."""
    ModelCheckpoint(model={}, config={"task": task}, evaluation=None, progress=Progress(), task_state=None,
                    versions={}).save(path)
    return path


@pytest.mark.parametrize(("task", "module"), [("nq", nq_commands), ("dummy", nq_commands),
                                              ("squad", squad_commands)])
def test_a_checkpoint_reaches_its_tasks_module_with_its_own_settings(task: str, module: object, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate and predict of a ``task`` checkpoint run that task's module's functions, and only those."""
    reached: list[tuple[str, argparse.Namespace]] = []
    for name in ("print_metrics", "write_answers"):
        for each in (nq_commands, squad_commands):
            monkeypatch.setattr(each, name, lambda args, name=name, each=each: reached.append(
                (f"{each.__name__}.{name}", args)))
    checkpoint = a_checkpoint_of(task, tmp_path / "best.pt")
    threshold = ["--no-answer-threshold", "0.5"] if module is squad_commands else ["--long-threshold", "0.5"]
    assert evaluate.main(["--checkpoint", str(checkpoint), "--split", "test", *threshold]) == 0
    assert predict.main(["--checkpoint", str(checkpoint), "--input", "in", "--output", "out", *threshold]) == 0
    assert [where for where, _ in reached] == [f"{module.__name__}.print_metrics",
                                               f"{module.__name__}.write_answers"]
    assert reached[0][1].split == "test" and reached[1][1].input == Path("in")


def test_another_tasks_flag_is_refused_before_the_tasks_module_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(squad_commands, "print_metrics", lambda args: pytest.fail("the squad evaluate ran"))
    checkpoint = a_checkpoint_of("squad", tmp_path / "best.pt")
    assert evaluate.main(["--checkpoint", str(checkpoint), "--long-threshold", "0.5"]) == 2
    assert capsys.readouterr().err == (f"distqa.evaluate: error: --long-threshold is a setting of another task; "
                                       f"{checkpoint} is of task 'squad'. Leave the flag out.\n")


def test_nothing_behind_the_dispatch_compares_a_task_name() -> None:
    """The dispatch picks the task's module (its class's commands); the commands do not ask which task again."""
    names = {"nq", "squad", "dummy"}
    paths = [*sorted((QA / "commands").glob("*.py")), QA / "nq" / "commands.py", QA / "squad" / "commands.py"]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert not constants & names, f"{path.relative_to(REPO_ROOT)}:{node.lineno} compares a task name"


def test_score_imports_no_task_for_the_qa_formats_and_runs_what_their_classes_declare(tmp_path: Path) -> None:
    """Scoring an NQ or SQuAD file needs neither torch nor transformers (the tasks' modules import both)."""
    for name, commands in LIGHT_COMMANDS.items():
        assert {command: task_class(name).commands[command] for command in commands} == commands
    gold = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-test-gold.jsonl"
    code = ("import sys; from distqa import score; "
            f"code = score.main(['--gold', {str(gold)!r}, '--submission', {str(tmp_path / 'none.csv')!r}]); "
            "print(code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "2 []", done.stdout + done.stderr
    assert done.stderr == f"distqa.score: error: {tmp_path / 'none.csv'}: no such submission file\n"
