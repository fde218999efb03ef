"""Real multi-process runs (torchrun, gloo, CPU): DDP equivalence (uneven shares of the global batch included), a
grown global batch, exact resume, the local launcher.

These are the claims about distribution, so they run the real entry point in fresh processes rather
than calling the loop in-process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distqa.distributed.stop import STOPPED_EXIT_CODE

from support.compare import final_weights, initial_weights, max_difference
from support.processes import clean_env, free_port, node_in_process, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT, reviews
from support.runs import AT_STEP, kill_launcher, run_training, training_process
from support.shared_runs import forty_steps_of_2_ranks, forty_steps_uninterrupted

STEPS = 3
TOLERANCE = 1e-5


def args_for(run_dir: Path, per_rank: int, global_batch: int = 32, *extra: str) -> list[str]:
    return [*MACHINERY_ARGS, "--output-dir", str(run_dir.parent), "--run-name", run_dir.name,
            "--global-batch-size", str(global_batch), "--per-rank-batch-size", str(per_rank),
            "--max-steps", str(STEPS), "--checkpoint-every", "0", "--classifier-dropout", "0", "--lr", "5e-4",
            # Clipping off: it would rescale a wrongly scaled gradient and hide the bug this test looks for.
            "--max-grad-norm", "0", *extra]


def test_ddp_and_uneven_shares_match_single_process_and_accumulation(tmp_path: Path) -> None:
    """After k steps of a global batch of 32: 1 rank × 32 == 1 rank × 8 with 4 accumulation steps == 2 ranks × 16
    == 3 ranks in uneven shares (11/11/10) of 3 micro-batches of 5: rank 0's are 5, 5 and 1 real rows, rank 2's 5, 5
    and none (a micro-batch of padding alone), which exercises no_sync, the padding, the cut to real rows and the
    weighting by share under DDP.

    AdamW's update hardly depends on the gradient's scale, so equal weights alone would not catch a
    gradient summed instead of averaged, or a share weighed wrongly; Adam's first moments, a running mean of the
    gradients, do."""
    runs = {
        "single": (1, 32),
        "single_accumulate": (1, 8),
        "ddp_b": (2, 16),
        "ddp_uneven": (3, 5),
    }
    weights, first_moments = {}, {}
    for name, (nproc, per_rank) in runs.items():
        result = run_training(args_for(tmp_path / name, per_rank), nproc=nproc)
        if name == "ddp_uneven":
            assert "global batch 32 = shares of 11/10 per rank × 3 ranks, 3 micro-batches of 5" in result.stderr
        weights[name] = final_weights(tmp_path / name)
        checkpoint = torch.load(sorted((tmp_path / name / "checkpoints").glob("*.pt"))[-1], weights_only=True)
        assert checkpoint["progress"]["step"] == STEPS
        assert checkpoint["progress"]["samples_in_epoch"] == STEPS * 32
        assert checkpoint["world_size"] == nproc
        first_moments[name] = {i: s["exp_avg"] for i, s in checkpoint["optimizer"]["state"].items()}

    initial = initial_weights("--classifier-dropout", "0")
    assert max_difference(weights["single"], initial) > 1e-4, "training did not move the weights"
    for name in ("single_accumulate", "ddp_b", "ddp_uneven"):
        difference = max_difference(weights["single"], weights[name])
        assert difference < TOLERANCE, f"{name} differs from single by {difference:.2e}"
        for index, moment in first_moments["single"].items():
            torch.testing.assert_close(first_moments[name][index], moment, rtol=1e-3, atol=1e-8,
                                       msg=lambda m, name=name: f"{name}: gradients differ: {m}")


def test_a_grown_global_batch_is_what_the_run_uses_logs_and_saves(tmp_path: Path) -> None:
    result = run_training([*MACHINERY_ARGS, "--output-dir", str(tmp_path), "--run-name", "grown", "--global-batch-size",
                           "4", "--per-rank-batch-size", "4", "--grow-global-batch", "true", "--lr", "1e-4",
                           "--warmup-steps", "4", "--max-steps", "2"], nproc=2)
    saved = json.loads((tmp_path / "grown" / "config.json").read_text())
    assert (saved["global_batch_size"], saved["warmup_steps"]) == (8, 2)
    assert saved["lr"] == pytest.approx(1e-4 * 2 ** 0.5)
    assert "grow_global_batch: 2 ranks × 4 per rank: global batch 4 -> 8, lr 0.0001 -> 0.000141" in result.stderr
    assert "global batch 8 = shares of 4 per rank × 2 ranks, 1 micro-batch of 4" in result.stderr


def six_steps_of_2_ranks(data: list[str], output_dir: Path) -> list[str]:
    """A 2-rank run of 6 steps with dropout and a checkpoint every 2 steps: with ``data`` of 80 reviews (64 training
    texts, 16 per step), 4 steps an epoch, so the run crosses an epoch boundary."""
    return [*MACHINERY_ARGS, *data, "--global-batch-size", "16", "--per-rank-batch-size", "4", "--max-steps", "6",
            "--classifier-dropout", "0.1", "--checkpoint-every", "2", "--output-dir", str(output_dir)]


@pytest.fixture(scope="module")
def six_steps_straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The data arguments of six_steps_of_2_ranks and the run directory of its uninterrupted run: the reference of
    the tests that stop it and resume it, run once for them."""
    directory = tmp_path_factory.mktemp("six-steps")
    data = reviews(directory, 80)
    run_training([*six_steps_of_2_ranks(data, directory), "--run-name", "straight"], nproc=2)
    return data, directory / "straight"


@pytest.fixture(scope="module")
def six_steps_stopped_at_3(six_steps_straight: tuple[list[str], Path],
                           tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of six_steps_of_2_ranks stopped at step 3 (--stop-at-step: the checkpoints of steps 2 and
    3), run once: each test resumes a copy of it."""
    data, _ = six_steps_straight
    directory = tmp_path_factory.mktemp("six-steps-stopped")
    # 4 steps per epoch; the stop at step 3 is mid-epoch 0.
    run_training([*six_steps_of_2_ranks(data, directory), "--run-name", "interrupted", "--stop-at-step", "3"], nproc=2)
    return directory / "interrupted"


def test_resume_continues_exactly(tmp_path: Path, six_steps_straight: tuple[list[str], Path],
                                  six_steps_stopped_at_3: Path) -> None:
    """A 2-rank run stopped mid-epoch and resumed with --resume auto ends with the same weights as an
    uninterrupted run — across an epoch boundary and with dropout on (per-rank RNG states restored)."""
    data, straight_dir = six_steps_straight
    common = six_steps_of_2_ranks(data, tmp_path)
    shutil.copytree(six_steps_stopped_at_3, tmp_path / "interrupted")
    stopped = torch.load(tmp_path / "interrupted" / "checkpoints" / "step-00000003.pt", weights_only=True)
    assert stopped["progress"] == {"step": 3, "epoch": 0, "samples_in_epoch": 48, "best_metric": None,
                                   "best_mode": None, "best_value": None, "evaluations_without_improvement": 0,
                                   "tracking_run_id": None, "pruned_at": 0, "seeds_per_step": True}
    assert len(stopped["rng"]) == 2
    assert not (tmp_path / "interrupted" / "checkpoints" / "step-00000006.pt").exists()
    again = run_training([*common, "--run-name", "interrupted", "--stop-at-step", "3"], nproc=2)
    assert "past stop_at_step=3: nothing to do" in again.stderr
    assert not (tmp_path / "interrupted" / "checkpoints" / "step-00000004.pt").exists()

    resumed = run_training([*common, "--run-name", "interrupted", "--resume", "auto"], nproc=2)
    assert "resumed from" in resumed.stderr and "at step 3" in resumed.stderr
    difference = max_difference(final_weights(straight_dir), final_weights(tmp_path / "interrupted"))
    assert difference < 1e-6, f"resumed run differs by {difference:.2e}"
    ended = torch.load(tmp_path / "interrupted" / "checkpoints" / "step-00000006.pt", weights_only=True)
    straight = torch.load(straight_dir / "checkpoints" / "step-00000006.pt", weights_only=True)
    # evaluated once, at the end: the same accuracy as the uninterrupted run's
    assert ended["progress"] == straight["progress"] == {
        "step": 6, "epoch": 1, "samples_in_epoch": 32, "best_metric": "accuracy", "best_mode": "max",
        "best_value": straight["progress"]["best_value"], "evaluations_without_improvement": 0,
        "tracking_run_id": None, "pruned_at": 0, "seeds_per_step": True}


def test_a_truncated_newest_checkpoint_is_skipped_and_the_run_still_ends_exactly(
        tmp_path: Path, six_steps_straight: tuple[list[str], Path], six_steps_stopped_at_3: Path) -> None:
    """The newest checkpoint of a 2-rank run is cut in half (a full disk, a copy that stopped); the next
    start reports it in one line naming the file, resumes from the one before and, resumption being
    exact, ends with the weights of an uninterrupted run."""
    data, straight_dir = six_steps_straight
    common = six_steps_of_2_ranks(data, tmp_path)
    shutil.copytree(six_steps_stopped_at_3, tmp_path / "damaged")
    checkpoints = tmp_path / "damaged" / "checkpoints"
    newest = checkpoints / "step-00000003.pt"
    data = newest.read_bytes()
    newest.write_bytes(data[:len(data) // 2])

    resumed = run_training([*common, "--run-name", "damaged"], nproc=2)
    reports = [line for line in resumed.stderr.splitlines() if "skipping a damaged checkpoint" in line]
    assert len(reports) == 1 and f"{newest} is truncated or damaged: {len(data) // 2} bytes, {len(data)} " \
        "were written" in reports[0], resumed.stderr
    assert f"resumed from {checkpoints / 'step-00000002.pt'} at step 2" in resumed.stderr
    assert (checkpoints / "step-00000003.pt.corrupt").exists()
    difference = max_difference(final_weights(straight_dir), final_weights(tmp_path / "damaged"))
    assert difference < 1e-6, f"the run resumed past a damaged checkpoint differs by {difference:.2e}"


def test_configuration_errors_exit_cleanly_before_any_rendezvous(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--lr", "-1"], cwd=tmp_path,
                            env=clean_env(PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "configuration error: lr must be > 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killed_run_resumes_from_its_last_complete_checkpoint(tmp_path: Path, signal_number: int) -> None:
    """SIGKILL ends the worker at once (also mid-write); SIGTERM stops it at the next check step with
    a checkpoint of that step and exit code 75. The next start removes any half-written temporary and
    resumes from the newest complete checkpoint."""
    args = [*MACHINERY_ARGS, "--output-dir", str(tmp_path), "--checkpoint-every", "5"]
    trainer = subprocess.Popen([sys.executable, "-m", "distqa.train", *args, "--max-steps", "100000"],
                               cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"), stderr=subprocess.DEVNULL)
    checkpoints = tmp_path / "local" / "checkpoints"
    try:
        # Any complete checkpoint: steps take milliseconds, so step 5's may already be pruned (keep_checkpoints).
        wait_for(lambda: any(checkpoints.glob("step-*.pt")), timeout=120)
        trainer.send_signal(signal_number)
        assert trainer.wait(timeout=30) == (STOPPED_EXIT_CODE if signal_number == signal.SIGTERM else -signal_number)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    half_written = checkpoints / ".step-00099999.pt.4242.tmp"  # as a kill during torch.save leaves it
    half_written.write_bytes(b"partial")
    newest = max(int(p.stem.split("-")[1]) for p in checkpoints.glob("step-*.pt"))

    resumed = run_training([*args, "--max-steps", str(newest + 3)])
    assert f"resumed from {checkpoints / f'step-{newest:08d}.pt'} at step {newest}" in resumed.stderr
    assert not half_written.exists()


def launch_locally(tmp_path: Path, *trainer_args: str, nodes: int = 2, max_restarts: int = 0,
                   launcher_args: tuple[str, ...] = (), **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", str(nodes),
         "--port", str(free_port()), "--run-id", "launcher-test", "--max-restarts", str(max_restarts),
         *launcher_args, "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path), *trainer_args],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)


def test_local_launcher_trains_two_nodes_and_only_rank_0_writes(tmp_path: Path) -> None:
    launcher = launch_locally(tmp_path, "--max-steps", "4", "--checkpoint-every", "2", "--tensorboard", "true",
                              "--global-batch-size", "8", "--per-rank-batch-size", "4")
    output, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, output
    run_dir = tmp_path / "launcher-test"
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["best.pt", "best.pt.crc32", "step-00000002.pt", "step-00000002.pt.crc32",  # and no
                           "step-00000004.pt", "step-00000004.pt.crc32"]                              # temporary files
    state = torch.load(run_dir / "checkpoints" / "step-00000004.pt", weights_only=True)
    assert state["saved_by_rank"] == 0 and state["world_size"] == 2 and len(state["rng"]) == 2
    assert state["config"]["run_name"] == "launcher-test" and state["config"]["max_steps"] == 4
    assert json.loads((run_dir / "config.json").read_text()) == state["config"]
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["world_size"], run["nodes"], run["backend"]) == (2, 2, "gloo")
    logs = {p.name: p.read_text() for p in (run_dir / "logs").iterdir()}
    assert set(logs) == {"rank-0.log", "rank-1.log"}
    writers = [name for name, text in logs.items() if "saved checkpoint" in text]
    assert writers == ["rank-0.log"], "exactly one process writes checkpoints"
    assert "[rank 1]" in logs["rank-1.log"] and "[rank 0]" not in logs["rank-1.log"]
    for node in (0, 1):  # each node is a worker.sh on loopback, its lines prefixed with its rank
        assert (f"[node {node}] worker.sh: run 'launcher-test': node {node} of 2 at 127.0.0.1, rendezvous "
                "127.0.0.1:") in output
    events = list((run_dir / "tensorboard").iterdir())
    assert len(events) == 1, "only rank 0 writes TensorBoard events"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(events[0])).Reload().Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/samples_per_s", "train/step_time_s"} <= set(scalars)


@pytest.mark.parametrize("moment", ["before-joining", "while-training"])
def test_local_launcher_stops_every_node_when_one_dies(tmp_path: Path, moment: str) -> None:
    """Killed before joining (as soon as its process exists, long before its imports end), rank 1 leaves
    rank 0 blocked inside init_process_group (a C++ wait no Python signal handler interrupts); killed
    once rank 0 has logged a step, inside a collective. Either way no process of the run may survive
    the launcher."""
    launcher = launch_locally(tmp_path, "--max-steps", "100000", "--checkpoint-every", "0")
    rank_0_log = tmp_path / "launcher-test" / "logs" / "rank-0.log"

    def training() -> bool:
        return rank_0_log.exists() and "step 2/" in rank_0_log.read_text()

    try:
        _kill_rank_1_once(tmp_path, (lambda: None) if moment == "before-joining" else
                          lambda: wait_for(training, timeout=180))
        output, _ = launcher.communicate(timeout=180)
    finally:
        kill_launcher(launcher)
    assert launcher.returncode != 0
    assert "stopping the others" in output
    assert training_process(0, tmp_path) is None and training_process(1, tmp_path) is None
    assert launcher.returncode is not None


def test_killed_worker_is_restarted_and_the_run_ends_as_if_uninterrupted(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """torchrun (--max-restarts 1) restarts every worker after one is SIGKILLed mid-run; they resume from the newest
    checkpoint and, since resumption is exact, end with the weights of a run that was never interrupted (dropout on,
    an epoch boundary crossed). The kill lands on rank 1 frozen right after step 7 (INJECT_FAULT=hang, once per run
    directory): a state the run stays in, past the checkpoint of step 5, however fast the machine."""
    uninterrupted = forty_steps_uninterrupted(tmp_path_factory)  # shared with test_faults.py and test_node_loss.py
    args = [*forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "5"]
    launcher = launch_locally(tmp_path, *args, max_restarts=1, INJECT_FAULT="hang:rank=1:step=7")
    marker = tmp_path / "launcher-test" / "logs" / "rank-1.fault"
    try:
        wait_for(marker.exists, timeout=180)
        os.kill(int(marker.read_text().split("(pid ")[1].rstrip(")\n")), signal.SIGKILL)
        output, _ = launcher.communicate(timeout=300)
    finally:
        kill_launcher(launcher, tmp_path)
    assert launcher.returncode == 0, output
    # Rank 0 lost its peer in step 8's collective and saved step 7, the last both completed (distqa.training.peer_loss).
    assert "resumed from" in output and "at step 7" in output, output
    difference = max_difference(final_weights(uninterrupted), final_weights(tmp_path / "launcher-test"))
    assert difference < 1e-6, f"the restarted run differs by {difference:.2e}"


def test_sigterm_to_one_nodes_agent_checkpoints_the_step_reached_and_resumes_exactly(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGTERM to node 1's torchrun agent mid-run (a preempted node, a job at its life span): the agent
    passes it to its worker, both ranks agree at the next step, rank 0 checkpoints that step (there is
    no periodic checkpoint: checkpoint_every 0), every process exits 75 and the launcher says so in one
    line, even with torchrun restarts left. Resuming from that checkpoint ends with the weights of an
    uninterrupted run (dropout on)."""
    uninterrupted = forty_steps_uninterrupted(tmp_path_factory)
    args = [*forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "0", "--stop-check-every", "1"]
    # Restarts left (the platform's and Slurm's default) must not start the stopped workers again. Rank 1 (node 1's
    # only worker) sends the SIGTERM to its parent, node 1's agent, at step 3 and holds that step until the agent has
    # passed it on (support.runs.AT_STEP): mid-run however fast the steps, not a race with the end of the run.
    (tmp_path / "at_step.py").write_text(AT_STEP)
    launcher = launch_locally(tmp_path, *args, max_restarts=2, launcher_args=("--entry-module", "at_step"),
                              PYTHONPATH=str(tmp_path), AT_STEP="3", AT_RANK="1", SIGNAL="SIGTERM",
                              TARGET_PID="parent")
    try:
        output, _ = launcher.communicate(timeout=180)
    finally:
        kill_launcher(launcher, tmp_path)
    assert launcher.returncode == 75, output
    checkpoints = sorted((tmp_path / "launcher-test" / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 1, checkpoints
    stopped = torch.load(checkpoints[0], weights_only=True)
    step = stopped["progress"]["step"]
    assert 3 <= step < 40 and checkpoints[0].name == f"step-{step:08d}.pt"
    assert f"[node 1] worker.sh: run 'launcher-test' node 1: stopped by SIGTERM at step {step}, checkpoint " \
        f"{checkpoints[0]} written; exit code 75" in output, output
    assert "a node stopped with a checkpoint of the step reached (exit 75)" in output
    assert "[node 0] worker.sh: run 'launcher-test' node 0: stopped by SIGTERM" in output, output
    assert training_process(0, tmp_path) is None and training_process(1, tmp_path) is None

    run_training([*MACHINERY_ARGS, *args, "--output-dir", str(tmp_path), "--run-name", "launcher-test"], nproc=2)
    difference = max_difference(final_weights(uninterrupted), final_weights(tmp_path / "launcher-test"))
    assert difference < 1e-6, f"the run stopped by SIGTERM and resumed differs by {difference:.2e}"


def test_worker_stop_after_stops_the_run_with_a_checkpoint(tmp_path: Path) -> None:
    """``worker.sh --stop-after`` (set below a job's life span) sends the same SIGTERM itself, in time.

    The timer runs from worker.sh's start; 30 s is about five times what the two workers take to start and train
    their first step on a quiet 2-core machine, so on a slow one the signal still finds them in the run. Both ranks
    wait after step 2 for that signal (INJECT_FAULT pause, distqa.training.faults), then stop at the step reached:
    the 30 s are spent waiting, not training flat out on both cores."""
    bad = node_in_process(["--stop-after", "1x", "--dry-run"], clean_env(PYTHON=sys.executable))
    assert bad.returncode == 2 and "--stop-after must be [Nd][Nh][Nm][Ns]" in bad.stderr and "got '1x'" in bad.stderr
    worker = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "worker.sh"), "--nproc-per-node", "2", "--run-id", "stop-after",
         "--stop-after", "0m30s", "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--max-steps", "100000",
         "--checkpoint-every", "0", "--global-batch-size", "8", "--per-rank-batch-size", "4"],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1",
                                     INJECT_FAULT="pause:rank=0:step=2,pause:rank=1:step=2"),
        capture_output=True, text=True, timeout=180)
    assert worker.returncode == 75, worker.stderr
    assert "stop after 30s" in worker.stderr and "--stop-after 30s reached: asking the workers to stop" in worker.stderr
    checkpoints = list((tmp_path / "stop-after" / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 1
    assert "worker.sh: run 'stop-after' node 0: stopped by SIGTERM at step " in worker.stderr
    assert f"checkpoint {checkpoints[0]} written; exit code 75" in worker.stderr


def _kill_rank_1_once(output_dir: Path, wait_before_kill) -> None:
    victim = wait_for(lambda: training_process(1, output_dir), timeout=180)
    wait_before_kill()
    os.kill(victim, signal.SIGKILL)
