"""A fork can delete the QA package (issue 32): a copy of the repository without ``src/distqa/qa/`` and without
the QA presets, samples, scripts, benchmarks, notebook and pages that docs/FORKING.md says a fork may delete
still shows the example task's settings, passes the doctor with it, trains it on 2 emulated nodes through its
own launcher, loses a node and resumes to the weights of an uninterrupted run; and a QA-only command there
ends in one line. Nothing is installed: the copy's ``src/`` comes first on ``PYTHONPATH``, in front of the
editable install of this checkout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, clean_env
from test_example import PRESET, TASK, lose_a_node_then_resume

QA_ONLY = (
    "src/distqa/qa",
    "configs",
    "data/nq-sample",
    "data/squad-sample",
    "docs/NQ_DATA.md",
    "docs/SQUAD.md",
    "docs/EVALUATION.md",
    "notebooks",
    "scripts/download_nq.sh",
    "scripts/make_nq_sample.sh",
    "scripts/make_squad_sample.sh",
    "scripts/train_synthetic_nq.sh",
    "scripts/train_synthetic_squad.sh",
    "bench/nq_pipeline.py",
    "bench/squad_pipeline.py",
    "bench/run_qa_features.py",
)
"""What a fork of another task deletes: the table "What a fork keeps, may delete and writes" in docs/FORKING.md."""


def copy_without_qa(destination: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked ones not ignored: what a commit would hold),
    copied to ``destination`` less QA_ONLY."""
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True, timeout=60).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file() and not any(name == gone or name.startswith(gone + "/") for gone in QA_ONLY):
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_without_qa(tmp_path_factory.mktemp("fork"))


def in_fork(fork: Path) -> dict[str, str]:
    """The environment of a command in the copy: its own package first on the path."""
    return clean_env(PYTHON=sys.executable, PYTHONPATH=str(fork / "src"))


def run_in(fork: Path, *command: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *command], cwd=fork, env=in_fork(fork), capture_output=True, text=True,
                          timeout=timeout)


def test_the_fork_guide_lists_what_the_copy_leaves_out() -> None:
    """QA_ONLY is what docs/FORKING.md's table says a fork may delete: each path named in a "may delete" row."""
    guide = (REPO_ROOT / "docs" / "FORKING.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("|") and "| may delete |" in line]
    named = {path for row in rows for path in re.findall(r"`([^`]+)`", row.split("|")[1])
             if (REPO_ROOT / path).exists()}
    assert named == set(QA_ONLY), f"the table's may-delete rows name {sorted(named)}"


def test_the_copy_runs_its_own_package_and_has_no_qa(fork: Path) -> None:
    result = run_in(fork, "-c", "import distqa, importlib.util; print(distqa.__file__); "
                                "print(importlib.util.find_spec('distqa.qa'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(fork / "src" / "distqa" / "__init__.py"), "None"]


def test_train_shows_the_example_tasks_settings_without_the_qa_package(fork: Path) -> None:
    result = run_in(fork, "-m", "distqa.train", "--task", TASK, "--help")
    assert result.returncode == 0, result.stderr
    assert "--embedding-dim" in result.stdout and "--data-file" in result.stdout
    assert "Traceback" not in result.stderr


def test_the_doctor_passes_with_the_example_task_without_the_qa_package(fork: Path) -> None:
    result = run_in(fork, "-m", "distqa.doctor", "--task", TASK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "doctor: all checks passed on 1 rank(s)" in result.stdout + result.stderr


@pytest.mark.distributed
def test_the_example_loses_a_node_and_resumes_without_the_qa_package(fork: Path, tmp_path: Path) -> None:
    """tests/test_example.py's claim, in the copy: its launcher, its package, its example."""
    lose_a_node_then_resume(tmp_path, fork, PYTHONPATH=str(fork / "src"))


def test_a_qa_only_command_ends_in_one_line_without_the_qa_package(fork: Path, tmp_path: Path) -> None:
    """predict has nothing to offer a text classifier's checkpoint: one line and exit 2, not a traceback."""
    trained = run_in(fork, "-m", "distqa.train", "--preset", str(fork / Path(PRESET).relative_to(REPO_ROOT)),
                     "--max-steps", "4", "--eval-every", "2", "--checkpoint-every", "2", "--progress-bar", "false",
                     "--tensorboard", "false", "--output-dir", str(tmp_path), "--run-name", "one", timeout=240)
    assert trained.returncode == 0, trained.stderr
    best = tmp_path / "one" / "checkpoints" / "best.pt"
    assert best.is_file()
    result = run_in(fork, "-m", "distqa.predict", "--checkpoint", str(best), "--input",
                    str(fork / "examples" / "text_classification" / "reviews.tsv"), "--output",
                    str(tmp_path / "predictions.csv"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "distqa.predict" in lines[0], result.stderr
    assert "text_classification" in lines[0] or TASK in lines[0], lines[0]
    assert not (tmp_path / "predictions.csv").exists()
