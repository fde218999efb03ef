"""Interrupting a run as a user does: Ctrl-C in the terminal (SIGINT to the launcher's foreground process group)
or SIGTERM to the launcher's PID is one graceful stop of every node; a second Ctrl-C stops them at once.

Each launcher runs in a session of its own here (``start_new_session``), so ``os.killpg`` is what a terminal's
Ctrl-C does to it. Its output goes to a file, read while it runs, so that the signals follow events in the run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import MACHINERY_ARGS, REPO_ROOT, WORKER, clean_env, free_port, wait_for
from distributed.conftest import kill_launcher, sigint_as_in_a_terminal, training_process

RUN_ID = "interrupted"
# No step is a check step before the signal can land (the first graceful-stop tests' flake: a stop at the step
# awaited), and a periodic checkpoint at step 4 that the stop's own must come after.
RUN_ARGS = ["--global-batch-size", "8", "--per-rank-batch-size", "4", "--checkpoint-every", "4",
            "--stop-check-every", "1"]


def launch(tmp_path: Path, output: Path, *trainer_args: str) -> subprocess.Popen[bytes]:
    """The local launcher with 2 nodes, in a session of its own with SIGINT as in a terminal, its output appended to
    ``output``."""
    with output.open("ab") as sink:
        return subprocess.Popen(
            ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", "2", "--port",
             str(free_port()), "--run-id", RUN_ID, "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path), *trainer_args],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=sigint_as_in_a_terminal)


def logged(path: Path, text: str) -> Callable[[], bool]:
    return lambda: path.exists() and text in path.read_text(errors="replace")


def end(launcher: subprocess.Popen[bytes], timeout: float) -> int:
    """The launcher's exit status, waited for up to ``timeout`` s (a hang guard)."""
    return launcher.wait(timeout=timeout)


def no_worker_left(tmp_path: Path) -> bool:
    return training_process(0, tmp_path) is None and training_process(1, tmp_path) is None


@pytest.mark.parametrize("interrupt", ["ctrl-c", "sigterm-to-the-launcher"])
def test_one_interrupt_checkpoints_the_step_reached_on_every_node_shows_their_lines_and_exits_75(
        tmp_path: Path, interrupt: str) -> None:
    """Ctrl-C (SIGINT to the launcher's process group, nodes included before the fix) or SIGTERM to the launcher
    alone, once rank 0 has logged step 6 (after the periodic checkpoint of step 4): every node's workers stop at one
    step with a checkpoint of it, each node's "stopped by" line reaches the launcher's output, and the launcher exits
    75. Each worker gets one signal: a second would end it at once (distqa.distributed.stop). The run started again
    after the Ctrl-C resumes from that checkpoint."""
    output = tmp_path / "launcher.out"
    launcher = launch(tmp_path, output, "--max-steps", "100000", *RUN_ARGS)
    try:
        wait_for(logged(tmp_path / RUN_ID / "logs" / "rank-0.log", "step 6/100000"), timeout=180)
        if interrupt == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            os.kill(launcher.pid, signal.SIGTERM)
        status = end(launcher, timeout=120)
    finally:
        kill_launcher(launcher, tmp_path)
    text = output.read_text(errors="replace")
    assert status == 75, text
    said = "SIGINT" if interrupt == "ctrl-c" else "SIGTERM"
    assert f"interrupted ({said}): every node checkpoints the step it reaches and stops (exit 75)" in text
    stops = {int(node): int(step) for node, step in re.findall(
        rf"\[node (\d)\] worker.sh: run '{RUN_ID}' node \1: stopped by SIGTERM at step (\d+), checkpoint .* written; "
        r"exit code 75", text)}
    assert sorted(stops) == [0, 1], text
    step = stops[0]
    assert stops[1] == step and step > 4, text  # the step reached, past the periodic checkpoint of step 4
    assert (tmp_path / RUN_ID / "checkpoints" / f"step-{step:08d}.pt").is_file()
    # torchrun logs each signal it passes on; its second would have ended the workers at once
    assert text.count("closing signal SIGTERM") == 2, text
    assert no_worker_left(tmp_path)
    if interrupt != "ctrl-c":
        return  # the same stop as Ctrl-C's from here on; one resume shows where it continues

    resumed_output = tmp_path / "resumed.out"
    resumed = launch(tmp_path, resumed_output, "--max-steps", str(step + 2), *RUN_ARGS)
    try:
        assert end(resumed, timeout=180) == 0, resumed_output.read_text(errors="replace")
    finally:
        kill_launcher(resumed, tmp_path)
    assert f"resumed from {tmp_path / RUN_ID / 'checkpoints' / f'step-{step:08d}.pt'} at step {step}" in \
        resumed_output.read_text(errors="replace")


def test_a_second_ctrl_c_stops_every_node_at_once(tmp_path: Path) -> None:
    """With no check step in reach (--stop-check-every 100000) the first Ctrl-C leaves the workers training toward
    one; the second ends them at once, and the launcher with 130, leaving no process of the run."""
    output = tmp_path / "launcher.out"
    launcher = launch(tmp_path, output, "--max-steps", "100000", "--checkpoint-every", "0", "--stop-check-every",
                      "100000")
    try:
        wait_for(logged(tmp_path / RUN_ID / "logs" / "rank-0.log", "step 2/100000"), timeout=180)
        os.killpg(launcher.pid, signal.SIGINT)
        wait_for(logged(output, "press Ctrl-C again to stop at once"), timeout=30)
        os.killpg(launcher.pid, signal.SIGINT)
        status = end(launcher, timeout=60)
    finally:
        kill_launcher(launcher, tmp_path)
    text = output.read_text(errors="replace")
    assert status == 130, text
    assert "interrupted again (SIGINT): stopping every node at once" in text
    assert "stopped by" not in text and not list((tmp_path / RUN_ID / "checkpoints").glob("step-*.pt"))
    assert no_worker_left(tmp_path)


# A worker that stops on its first SIGTERM as distqa.train does (its report for worker.sh, exit 75), but takes a
# while to end after writing the report, and counts every SIGTERM it gets.
SLOW_TO_END = """
import os, signal, sys, time
from pathlib import Path

out = Path(sys.argv[-1])  # after the --run-name worker.sh passes
signals = []
signal.signal(signal.SIGTERM, lambda *_: signals.append(1))
(out / "ready").touch()
while not signals:
    time.sleep(0.05)
Path(os.environ["WORKER_STOP_REPORT_DIR"], "rank-0").write_text("stopped by SIGTERM at step 1 (rank 0)\\n")
time.sleep(3)  # several times the agent's 0.5 s look at the reports
(out / "signals").write_text(str(len(signals)))
sys.exit(75)
"""


def test_an_agent_that_got_the_signal_passes_it_to_its_workers_once(tmp_path: Path) -> None:
    """distqa.launch.agent SIGTERMs itself once a worker has reported a graceful stop, so that torchrun restarts
    nothing; when the agent got the signal itself it must not: torchrun would pass the second one on to workers still on
    their way out (ElasticAgent.run shuts the workers down again when a signal interrupts the first shutdown)."""
    (tmp_path / "slow_to_end.py").write_text(SLOW_TO_END)
    with (tmp_path / "node.out").open("ab") as sink:
        node = subprocess.Popen(["bash", WORKER, "--nproc-per-node", "1", "--run-id", "once", "--entry-module",
                                 "slow_to_end", "--", str(tmp_path)],
                                cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, PYTHONPATH=str(tmp_path)),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "ready").exists() or node.poll() is not None, timeout=120)
        node.send_signal(signal.SIGTERM)  # worker.sh passes it to its agent, the agent to its worker
        status = end(node, timeout=60)
    finally:
        kill_launcher(node, tmp_path)
    assert status == 75, (tmp_path / "node.out").read_text(errors="replace")
    assert (tmp_path / "signals").read_text() == "1", (tmp_path / "node.out").read_text(errors="replace")
