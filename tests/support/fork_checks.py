"""The check every task gets, a fork's too: its run on 2 emulated nodes through the local launcher loses node 1 right
after step 30, the same command run again resumes, and the resumed run ends with the weights of an uninterrupted
one. tests/distributed/test_example.py runs it on the example, tests/distributed/test_upkeep.py on a fork's stub after
an update, and a fork's own tests/test_<name>.py (written by `make new-fork`) on its task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import REPO_ROOT
from support.runs import kill_launcher, start_training

STEPS = 100
RUN_ARGS = ("--max-steps", str(STEPS), "--checkpoint-every", "20", "--eval-every", "50", "--log-every", "50",
            "--progress-bar", "false", "--tensorboard", "false")
NODE_1_LOST = "kill-node:rank=1:step=30"
"""Node 1 goes down right after step 30 (after the checkpoint of step 20, before the next): its torchrun agent and
its worker SIGKILLed by the supported fault injection (distqa.training.faults), which lands at that step on any machine
(a small task trains a step in milliseconds, faster than a test can watch for a checkpoint). Node 0 saves step 30, the
last it completed, before it leaves (distqa.training.peer_loss): the resume redoes no step."""


def launch(run_id: str, output_dir: Path, preset: Path, repo: Path = REPO_ROOT, **env: str) -> subprocess.Popen[str]:
    """The run of ``preset`` on 2 emulated nodes × 1 process, through the README's local launcher of the checkout
    ``repo`` (tests/distributed/test_upkeep.py passes a fork's)."""
    command = ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()), "--run-id",
               run_id, "--", "--preset", str(preset), "--output-dir", str(output_dir), *RUN_ARGS]
    log = (output_dir / f"{run_id}.log").open("a")
    return subprocess.Popen(command, cwd=repo, env=clean_env(PYTHON=sys.executable, **env), stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def train_uninterrupted(output_dir: Path, preset: Path, repo: Path = REPO_ROOT, **env: str) -> subprocess.Popen[str]:
    """The same training, never interrupted, as the reference weights: the same 2 ranks under one torchrun of the
    checkout ``repo`` (the launcher's nodes are what the interrupted run tests; the reference needs only the ranks,
    without the launcher's data preparation and second agent)."""
    return start_training(["--preset", str(preset), "--output-dir", str(output_dir), "--run-name", "uninterrupted",
                           *RUN_ARGS], output_dir / "uninterrupted.log", nproc=2, cwd=repo,
                          env=clean_env(OMP_NUM_THREADS="1", **env))


def lose_a_node_then_resume(output_dir: Path, preset: Path, repo: Path = REPO_ROOT, **env: str) -> None:
    """Node 1 lost after step 30, the same launcher command run again, and an uninterrupted run: the fault lands where
    it should, the second launch resumes, and the resumed run (``killed``) ends with the uninterrupted run's weights
    (``uninterrupted``, :func:`train_uninterrupted`), both under ``output_dir``."""
    killed = launch("killed", output_dir, preset, repo, INJECT_FAULT=NODE_1_LOST, **env)
    try:
        assert killed.wait(timeout=180) != 0, "the launcher noticed the lost node"
    finally:
        kill_launcher(killed)
    rank_1_log = output_dir / "killed" / "logs" / "rank-1.log"
    assert rank_1_log.is_file(), (output_dir / "killed.log").read_text()  # no worker started: the launcher says why
    assert "fault injection (INJECT_FAULT): kill-node rank 1 after step 30 now" in rank_1_log.read_text()
    checkpoints = (output_dir / "killed" / "checkpoints").glob("step-*.pt")
    interrupted_at = max(int(p.stem.split("-")[1]) for p in checkpoints)
    assert interrupted_at == 30, \
        "node 0, the survivor, saved step 30, the last it completed (distqa.training.peer_loss)"

    # The same command and run id: --resume auto picks the newest intact checkpoint, and the fault, done in this
    # run directory already, does not fire again.
    again = launch("killed", output_dir, preset, repo, INJECT_FAULT=NODE_1_LOST, **env)
    uninterrupted = train_uninterrupted(output_dir, preset, repo, **env)
    assert again.wait(timeout=300) == 0, (output_dir / "killed.log").read_text()
    assert uninterrupted.wait(timeout=300) == 0, (output_dir / "uninterrupted.log").read_text()
    assert f"resumed from {output_dir / 'killed' / 'checkpoints'}" in (output_dir / "killed.log").read_text()

    difference = max_difference(final_weights(output_dir / "killed"), final_weights(output_dir / "uninterrupted"))
    assert difference < 1e-6, f"the resumed run differs from the uninterrupted one by {difference:.2e}"
