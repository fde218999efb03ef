"""The worked example of a fork's task (examples/text_classification), outside the package: it trains on 2 emulated
nodes through the local launcher and survives a node killed mid-run (the launcher run again resumes to the weights of
an uninterrupted run), and a task package outside the checkout runs through its PYTHONPATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from support.fork_checks import lose_a_node_then_resume
from support.processes import clean_env, free_port
from support.repo import EXAMPLE, REPO_ROOT
from support.repo import EXAMPLE_PRESET as PRESET

TASK = "examples.text_classification.task:TextClassification"


def test_two_nodes_resume_after_a_node_is_killed_to_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    lose_a_node_then_resume(tmp_path, Path(PRESET))
    # best.pt is chosen by the example's own metric, and holds the example's inference state.
    best = torch.load(tmp_path / "killed" / "checkpoints" / "best.pt", weights_only=True)
    progress = best["progress"]
    assert (progress["best_metric"], progress["best_mode"]) == ("accuracy", "max")
    assert progress["best_value"] == best["evaluation"]["accuracy"] > 0.5
    assert best["config"]["task"] == TASK and set(best["task_state"]) == {"labels", "vocabulary"}
    # What docs/CONFIGURATION.md says best.pt holds: no optimizer, schedule, scaler or RNG states.
    assert set(best) == {"format_version", "model", "config", "task_state", "evaluation", "progress", "versions"}


def test_a_task_package_outside_the_checkout_runs_through_its_pythonpath(tmp_path: Path) -> None:
    """docs/FORKING.md, "A task outside the checkout": a package that only PYTHONPATH finds, run from a folder of
    its own. prepare takes the same --task as training; the local launcher keeps PYTHONPATH on every node (worker.sh
    puts the repository in front of it); the run directory, best.pt included, lands in results/ of that folder."""
    fork, work = tmp_path / "fork", tmp_path / "work"
    (fork / "mytask").mkdir(parents=True)
    work.mkdir()
    (fork / "mytask" / "__init__.py").write_text("")
    shutil.copy(EXAMPLE / "task.py", fork / "mytask" / "task.py")
    shutil.copy(EXAMPLE / "reviews.tsv", work / "reviews.tsv")
    env = clean_env(PYTHON=sys.executable, PYTHONPATH=str(fork))
    task = ["--task", "mytask.task:TextClassification"]
    prepare = subprocess.run([sys.executable, "-m", "distqa.prepare", *task], cwd=work, env=env, capture_output=True,
                             text=True, timeout=120)
    assert prepare.returncode == 0 and "has nothing to build before training" in prepare.stderr, prepare.stderr
    sizes = ["--preset", "none", "--global-batch-size", "32", "--per-rank-batch-size", "16", "--max-steps", "8",
             "--eval-every", "4", "--checkpoint-every", "4", "--progress-bar", "false", "--tensorboard", "false"]
    run = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", "2", "--port", str(free_port()),
         "--run-id", "mine", "--", *task, "--data-file", "reviews.tsv", *sizes], cwd=work, env=env,
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    checkpoints = work / "results" / "mine" / "checkpoints"
    assert {path.name for path in checkpoints.glob("*.pt")} == {"step-00000004.pt", "step-00000008.pt", "best.pt"}
    assert torch.load(checkpoints / "best.pt", weights_only=True)["config"]["task"] == "mytask.task:TextClassification"
