"""The worked example of a fork's task (examples/text_classification), outside the package: it trains on 2
emulated nodes through the local launcher, survives a node killed mid-run (the launcher run again resumes
to the weights of an uninterrupted run), keeps best.pt by its own metric, and reports bad data in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO_ROOT, clean_env, final_weights, free_port, max_difference, training_process, wait_for

EXAMPLE = REPO_ROOT / "examples" / "text_classification"
TASK = "examples.text_classification.task:TextClassification"
PRESET = str(EXAMPLE / "preset.toml")
STEPS = 100
FROZEN_AT = 30
"""Node 1 stops dead before step 31 of the run that is killed: after the checkpoint of step 20, before the next."""
RUN_ARGS = ("--max-steps", str(STEPS), "--checkpoint-every", "20", "--eval-every", "50", "--log-every", "50",
            "--progress-bar", "false", "--tensorboard", "false")
FREEZE_RANK_1 = """
import os, sys, time
from pathlib import Path
from distqa.trainer import Trainer
from distqa.train import main

train_step = Trainer.train_step


def frozen_on_rank_1(self, micro_batches):  # the run's own step, but rank 1 never starts step FROZEN_AT + 1
    if os.environ["RANK"] == "1" and self.progress.step == int(os.environ["FROZEN_AT"]):
        Path(os.environ["FROZEN_MARK"]).touch()
        time.sleep(3600)
    return train_step(self, micro_batches)


Trainer.train_step = frozen_on_rank_1
sys.exit(main())
"""
"""An entry module for the run that is killed: the kill then lands mid-run at a known step on any machine (the
example trains a step in milliseconds, faster than a test can watch for a checkpoint)."""


def launch(run_id: str, output_dir: Path, *launcher_args: str, **env: str) -> subprocess.Popen[str]:
    """The example on 2 emulated nodes × 1 process, through the README's local launcher."""
    command = ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()), "--run-id",
               run_id, *launcher_args, "--", "--preset", PRESET, "--output-dir", str(output_dir), *RUN_ARGS]
    log = (output_dir / f"{run_id}.log").open("a")
    return subprocess.Popen(command, cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, **env), stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def kill_node(rank: int, output_dir: Path, module: str) -> None:
    """SIGKILL one emulated node whole: its worker, the worker's torchrun agent and the agent's worker.sh."""
    worker = wait_for(lambda: training_process(rank, output_dir, module), timeout=60)
    agent = parent_of(worker)
    for pid in (parent_of(agent), agent, worker):
        os.kill(pid, signal.SIGKILL)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_committed_data_is_what_the_generator_writes(tmp_path: Path) -> None:
    written = tmp_path / "reviews.tsv"
    subprocess.run([sys.executable, "-m", "examples.text_classification.make_data", "--output", str(written)],
                   cwd=REPO_ROOT, env=clean_env(), check=True, capture_output=True, timeout=60)
    assert written.read_bytes() == (EXAMPLE / "reviews.tsv").read_bytes()


@pytest.mark.distributed
def test_two_nodes_resume_after_a_node_is_killed_to_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    (tmp_path / "freeze_rank_1.py").write_text(FREEZE_RANK_1)
    frozen = tmp_path / "rank-1-frozen"
    killed = launch("killed", tmp_path, "--entry-module", "freeze_rank_1", PYTHONPATH=str(tmp_path),
                    FROZEN_AT=str(FROZEN_AT), FROZEN_MARK=str(frozen))
    try:
        wait_for(frozen.exists, timeout=120)  # about 10 s on a quiet 2-core machine
        kill_node(1, tmp_path, "freeze_rank_1")
        assert killed.wait(timeout=120) != 0, "the launcher noticed the lost node"
    finally:
        if killed.poll() is None:
            killed.kill()
    interrupted_at = max(int(p.stem.split("-")[1]) for p in (tmp_path / "killed" / "checkpoints").glob("step-*.pt"))
    assert interrupted_at == 20, "the newest checkpoint is the one before the freeze"

    again = launch("killed", tmp_path)  # the same run id: --resume auto picks the newest intact checkpoint
    uninterrupted = launch("uninterrupted", tmp_path)
    assert again.wait(timeout=300) == 0, (tmp_path / "killed.log").read_text()
    assert uninterrupted.wait(timeout=300) == 0, (tmp_path / "uninterrupted.log").read_text()
    assert f"resumed from {tmp_path / 'killed' / 'checkpoints'}" in (tmp_path / "killed.log").read_text()

    difference = max_difference(final_weights(tmp_path / "killed"), final_weights(tmp_path / "uninterrupted"))
    assert difference < 1e-6, f"the resumed run differs from the uninterrupted one by {difference:.2e}"
    # best.pt is chosen by the example's own metric, and holds the example's inference state.
    best = torch.load(tmp_path / "killed" / "checkpoints" / "best.pt", weights_only=True)
    progress = best["progress"]
    assert (progress["best_metric"], progress["best_mode"]) == ("accuracy", "max")
    assert progress["best_value"] == best["evaluation"]["accuracy"] > 0.5
    assert best["config"]["task"] == TASK and set(best["task_state"]) == {"labels", "vocabulary"}


@pytest.mark.parametrize(("line", "said"), [("positive no tab here", "expected LABEL<TAB>TEXT"),
                                            ("\tno label", "expected LABEL<TAB>TEXT")])
def test_a_bad_data_line_is_one_line_naming_the_file_and_line(line: str, said: str, tmp_path: Path) -> None:
    data = tmp_path / "reviews.tsv"
    data.write_text((EXAMPLE / "reviews.tsv").read_text() + line + "\n")
    result = subprocess.run([sys.executable, "-m", "distqa.train", "--preset", PRESET, "--data-file", str(data),
                             "--output-dir", str(tmp_path)], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"distqa.train: data error: {data}:1201: {said}, got "
                                                  f"{line[:60]!r}; fix or remove the line."]
