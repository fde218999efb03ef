"""`python -m distqa.predict|evaluate|score|export` run the command of the checkpoint's task (score: of
``--format``'s), importing that task and nothing else; a task without the command, or one this checkout lacks
(a fork that deleted distqa/qa), is one line and exit status 2, as is a checkpoint of format 2 (score's QA formats:
tests/qa/test_commands_qa.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from distqa import evaluate, export, predict, score
from distqa.checkpoint.commands import checkpoint_task
from distqa.checkpoint.format import FORMAT_2_REFUSED, ModelCheckpoint, Progress, save_checkpoint
from distqa.config import ConfigError
from distqa.config.sources import run_task
from distqa.tasks.base import Task
from distqa.tasks.commands import task_command

from support.processes import clean_env
from support.repo import REPO_ROOT

EXAMPLE_TASK = "examples.text_classification.task:TextClassification"
ENTRY_POINTS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "predict": predict.main, "evaluate": evaluate.main, "export": export.main}


def command_line(command: str, checkpoint: Path, tmp_path: Path) -> list[str]:
    """The documented command line of ``command`` for ``checkpoint`` (files under ``tmp_path``)."""
    rest = {"predict": ["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.csv")],
            "evaluate": [], "export": ["--output", str(tmp_path / "model")]}[command]
    return ["--checkpoint", str(checkpoint), *rest]


@pytest.fixture(scope="module")
def example_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A best.pt of the fork's example task (examples/text_classification): its model and config, as training saves."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(REPO_ROOT))  # examples/ is imported from the repository, as `python -m` does
        from examples.text_classification.task import TextClassification, TextClassificationConfig

        config = TextClassificationConfig(task=EXAMPLE_TASK, data_file=str(REPO_ROOT / "examples" /
                                                                            "text_classification" / "reviews.tsv"))
        model = TextClassification(config).build_model()
    path = tmp_path_factory.mktemp("example") / "best.pt"
    ModelCheckpoint(model=model.state_dict(), config=config.to_dict(), evaluation=None, progress=Progress(),
                    task_state=None, versions={}).save(path)
    return path


def a_checkpoint_of(task: str, path: Path) -> Path:
    """A best.pt whose config names ``task`` (what the dispatch reads first), weights aside."""
    ModelCheckpoint(model={}, config={"task": task}, evaluation=None, progress=Progress(), task_state=None,
                    versions={}).save(path)
    return path


def one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.rstrip("\n")


@pytest.mark.parametrize("command", list(ENTRY_POINTS))
def test_a_task_without_the_command_says_so_in_one_line(command: str, example_checkpoint: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    assert ENTRY_POINTS[command](command_line(command, example_checkpoint, tmp_path)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"python -m distqa.{command}: error: task 'text_classification' has no {command} "
                           "command: TextClassification.commands names none."), line
    assert not list(tmp_path.iterdir())  # nothing written


def test_score_of_a_format_whose_task_has_no_score_command_is_one_line(capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    gold = tmp_path / "gold.jsonl"
    gold.write_text("{}\n")
    assert score.main(["--format", EXAMPLE_TASK, "--gold", str(gold), "--predictions", str(gold)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("distqa.score: error: task 'text_classification' has no score command"), line


def test_dispatch_imports_the_checkpoints_task_and_nothing_of_the_qa_package(example_checkpoint: Path,
                                                                             tmp_path: Path) -> None:
    """The entry points import no task at the top, and finding the task imports that one only (not every
    registered task to read their declarations)."""
    code = ("import sys; from distqa import evaluate, export, predict, score; "
            f"codes = [predict.main({command_line('predict', example_checkpoint, tmp_path)!r}), "
            f"evaluate.main({command_line('evaluate', example_checkpoint, tmp_path)!r})]; "
            "loaded = sorted(m for m in sys.modules if m.startswith(('distqa.qa', 'distqa.encoders')));"
            "print(codes, loaded, 'examples.text_classification.task' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.strip() == "[2, 2] [] True", done.stdout + done.stderr


def copy_without_the_qa_package(root: Path) -> Path:
    """The package and the example task, as a fork that deleted distqa/qa has them."""
    shutil.copytree(REPO_ROOT / "src" / "distqa", root / "src" / "distqa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(root / "src" / "distqa" / "qa", ignore_errors=True)  # gone already in a fork that left it out
    shutil.copytree(REPO_ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return root


IN_THE_FORK = """
import contextlib, importlib.util, io, json, sys
import distqa
from distqa import evaluate, export, predict, score
said = {"distqa": distqa.__file__, "qa": importlib.util.find_spec("distqa.qa") is not None}
for name, main, argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = {"predict": predict, "evaluate": evaluate, "export": export, "score": score}[main].main(argv)
        except SystemExit as exit_:  # --help
            code = exit_.code
    said[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(said))
"""
"""Imports the entry points and runs each command line given (name, entry point, argv) in one process."""


def test_without_the_qa_package_the_commands_import_and_refuse_in_one_line(example_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    fork = copy_without_the_qa_package(tmp_path / "fork")
    runs = [(command, command, command_line(command, example_checkpoint, tmp_path)) for command in ENTRY_POINTS]
    runs += [("nq checkpoint", "predict", command_line("predict", a_checkpoint_of("nq", tmp_path / "nq.pt"), tmp_path)),
             ("score", "score", ["--gold", "gold.jsonl", "--submission", "submission.csv"]),
             ("help", "evaluate", ["--help"])]
    done = subprocess.run([sys.executable, "-c", IN_THE_FORK, json.dumps(runs)], cwd=fork, capture_output=True,
                          text=True, env=clean_env(PYTHONPATH=f"{fork / 'src'}:{fork}"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    said = json.loads(done.stdout)
    assert said["distqa"] == str(fork / "src" / "distqa" / "__init__.py") and not said["qa"]
    for command in ENTRY_POINTS:
        code, out, err = said[command]
        assert code == 2 and not out and one_error_line(err).startswith(
            f"python -m distqa.{command}: error: task 'text_classification' has no {command} command"), err
    code, _, err = said["nq checkpoint"]
    assert code == 2 and one_error_line(err).startswith(
        "python -m distqa.predict: error: task 'nq': no module named 'distqa.qa'"), err
    code, _, err = said["score"]
    assert code == 2 and one_error_line(err).startswith(
        "distqa.score: error: task 'dummy': its score command distqa.qa.nq.commands:score: importing "
        "distqa.qa.nq.commands failed (ModuleNotFoundError: No module named 'distqa.qa')"), err
    code, out, _ = said["help"]
    assert code == 0 and "--checkpoint CHECKPOINT" in out, out


def test_unreadable_checkpoints_say_why(tmp_path: Path) -> None:
    assert checkpoint_task(a_checkpoint_of("nq", tmp_path / "nq.pt")) == "nq"
    with pytest.raises(ConfigError, match=f"checkpoint {tmp_path / 'nope.pt'} does not exist; train first"):
        checkpoint_task(tmp_path / "nope.pt")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match=re.escape("is a directory without distqa.json: not one written by python "
                                                  "-m distqa.export")):
        checkpoint_task(tmp_path / "plain")
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes((tmp_path / "nq.pt").read_bytes()[:100])
    with pytest.raises(ConfigError, match=re.escape(str(damaged))):
        checkpoint_task(damaged)


@pytest.mark.parametrize("command", list(ENTRY_POINTS))
def test_a_format_2_checkpoint_is_one_line_naming_the_file_and_what_to_do(command: str, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Its config names a dataset, not a task: the dispatch says in one line what loading it says."""
    old = tmp_path / "best.pt"
    save_checkpoint({"format_version": 2, "config": {"dataset": "nq"}, "decoding": {}}, old)
    assert ENTRY_POINTS[command](command_line(command, old, tmp_path)) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"python -m distqa.{command}: error: {FORMAT_2_REFUSED.format(path=old)}", line
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "best.pt.crc32"]  # nothing written


class CommandsElsewhere(Task):
    """A task whose commands name what is not there."""

    name = "elsewhere"
    commands: ClassVar[Mapping[str, str]] = {
        "predict": "no_such_package.commands:main", "evaluate": "distqa.checkpoint.commands:RUN_FILE"}


def test_a_command_path_that_does_not_lead_to_a_function_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^task 'elsewhere': its predict command no_such_package.commands:main: "
                       r"importing no_such_package.commands failed \(ModuleNotFoundError"):
        task_command("unit.test_commands:CommandsElsewhere", "predict")
    with pytest.raises(ConfigError, match=re.escape(
            "its evaluate command distqa.checkpoint.commands:RUN_FILE is not a "
                                                                  "function")):
        task_command("unit.test_commands:CommandsElsewhere", "evaluate")
    with pytest.raises(ConfigError, match=r"task 'elsewhere' has no export command \(it has evaluate, predict\)"):
        task_command("unit.test_commands:CommandsElsewhere", "export")


def test_without_a_checkpoint_the_commands_ask_the_projects_task(tmp_path: Path) -> None:
    """--help and score's default format: the task of project.toml's [run] args, under the command line's."""
    project = tmp_path / "project.toml"
    project.write_text(f'[run]\nargs = "--task {EXAMPLE_TASK}"\n[jobs]\nargs = ""\n[image]\npython = []\napt = []\n')
    environ = {"ENV_FILE": str(tmp_path / "none.env")}
    (tmp_path / "none.env").write_text("")
    assert run_task(["--gold", "g"], environ, project) == EXAMPLE_TASK
    assert run_task(["--task", "dummy", "--help"], environ, project) == "dummy"
    assert run_task([], environ, tmp_path / "missing.toml") == "dummy"  # no project file: the default task
