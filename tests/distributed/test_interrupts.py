"""Interrupting a run as a user does: Ctrl-C in the terminal (SIGINT to the launcher's foreground process group)
or SIGTERM to the launcher's PID is one graceful stop of every node; a second Ctrl-C stops them at once.

Each launcher runs in a session of its own here (``start_new_session``), so ``os.killpg`` is what a terminal's
Ctrl-C does to it. Its output goes to a file, read while it runs, so that the signals follow events in the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.processes import clean_env, free_port, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT, WORKER
from support.runs import kill_launcher, sigint_as_in_a_terminal, training_process
from support.shared_runs import once_per_session

RUN_ID = "interrupted"
# No step is a check step before the signal can land (the first graceful-stop tests' flake: a stop at the step
# awaited), and a periodic checkpoint at step 4 that the stop's own must come after.
RUN_ARGS = ["--global-batch-size", "8", "--per-rank-batch-size", "4", "--checkpoint-every", "4",
            "--stop-check-every", "1"]


def launch(tmp_path: Path, output: Path, *trainer_args: str, nodes: int = 2,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The local launcher with ``nodes`` nodes, in a session of its own with SIGINT as in a terminal, its output
    appended to ``output``."""
    with output.open("ab") as sink:
        return subprocess.Popen(
            ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", str(nodes), "--port",
             str(free_port()), "--run-id", RUN_ID, "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path), *trainer_args],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, **(env or {})), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=sigint_as_in_a_terminal)


def logged(path: Path, text: str) -> Callable[[], bool]:
    return lambda: path.exists() and text in path.read_text(errors="replace")


def end(launcher: subprocess.Popen[bytes], timeout: float) -> int:
    """The launcher's exit status, waited for up to ``timeout`` s (a hang guard)."""
    return launcher.wait(timeout=timeout)


def no_worker_left(tmp_path: Path, ranks: int = 2) -> bool:
    return all(training_process(rank, tmp_path) is None for rank in range(ranks))


STOPPED_ARGS = ["--global-batch-size", "8", "--per-rank-batch-size", "1", "--checkpoint-every", "4",
                "--stop-check-every", "1"]
"""RUN_ARGS with one sample per rank, so that the same global batch splits over 2 and over 8 nodes."""
STOP_AT = 6
"""Every rank pauses after this step (INJECT_FAULT pause, which the stop's SIGTERM ends) and the stop lands there: the
same steps, collectives and checkpoints in every run, whatever the machine's load, and no training while waiting."""


def stopped_run(tmp_path_factory: pytest.TempPathFactory, nodes: int, interrupt: str) -> tuple[Path, dict[str, Any]]:
    """The local launcher with ``nodes`` nodes stopped by ``interrupt`` once every rank paused after step STOP_AT, made
    once per session (the launcher's folder, its exit status and whether a worker was left). Every process of the run
    carries bench/scale.py's probe (bench/scale_probe), which counts the collectives and store operations each one
    makes: the counts per rank at 2 and 8 nodes are compared below."""
    def produce(folder: Path) -> dict[str, Any]:
        output = folder / "launcher.out"
        pause = ",".join(f"pause:rank={rank}:step={STOP_AT}" for rank in range(nodes))
        probe = {"SCALE_PROBE_DIR": str(folder / "probe"), "PYTHONPATH": str(REPO_ROOT / "bench" / "scale_probe"),
                 "INJECT_FAULT": pause}
        (folder / "probe").mkdir(exist_ok=True)
        launcher = launch(folder, output, "--max-steps", "100000", *STOPPED_ARGS, nodes=nodes, env=probe)
        try:
            logs = folder / RUN_ID / "logs"
            wait_for(lambda: len(list(logs.glob("rank-*.fault"))) == nodes or launcher.poll() is not None,
                     timeout=180 + 30 * nodes)
            if launcher.poll() is None:  # else it ended early: its output says why, and the test shows it
                if interrupt == "ctrl-c":
                    os.killpg(launcher.pid, signal.SIGINT)
                else:
                    os.kill(launcher.pid, signal.SIGTERM)
            status = end(launcher, timeout=120 + 15 * nodes)
        finally:
            kill_launcher(launcher, folder)
        return {"status": status, "worker_left": not no_worker_left(folder, nodes)}
    return once_per_session(tmp_path_factory, f"stopped-{nodes}-{interrupt}", produce)


@pytest.mark.parametrize(("interrupt", "nodes"), [("ctrl-c", 2), ("sigterm-to-the-launcher", 8)])
def test_one_interrupt_checkpoints_the_step_reached_on_every_node_shows_their_lines_and_exits_75(
        tmp_path_factory: pytest.TempPathFactory, interrupt: str, nodes: int) -> None:
    """Ctrl-C (SIGINT to the launcher's process group, nodes included before the fix) or SIGTERM to the launcher
    alone, once every rank has reached step 6 (after the periodic checkpoint of step 4): every node's workers stop at
    one step with a checkpoint of it, each node's "stopped by" line reaches the launcher's output, and the launcher
    exits 75, leaving no process; at 8 nodes too. Each worker gets one signal: a second would end it at once
    (distqa.distributed.stop). The run started again after the Ctrl-C resumes from that checkpoint."""
    folder, run = stopped_run(tmp_path_factory, nodes, interrupt)
    text = (folder / "launcher.out").read_text(errors="replace")
    assert run["status"] == 75, text
    said = "SIGINT" if interrupt == "ctrl-c" else "SIGTERM"
    assert f"interrupted ({said}): every node checkpoints the step it reaches and stops (exit 75)" in text
    stops = {int(node): int(step) for node, step in re.findall(
        rf"\[node (\d+)\] worker.sh: run '{RUN_ID}' node \1: stopped by SIGTERM at step (\d+), checkpoint .* "
        r"written; exit code 75", text)}
    assert sorted(stops) == list(range(nodes)), text
    assert set(stops.values()) == {STOP_AT}, text  # the step reached, past the periodic checkpoint of step 4
    assert (folder / RUN_ID / "checkpoints" / f"step-{STOP_AT:08d}.pt").is_file()
    # torchrun logs each signal it passes on; its second would have ended the workers at once
    assert text.count("closing signal SIGTERM") == nodes, text
    assert not run["worker_left"]
    if interrupt != "ctrl-c":
        return  # the same stop as Ctrl-C's from here on; one resume shows where it continues

    resumed_output = folder / "resumed.out"
    resumed = launch(folder, resumed_output, "--max-steps", str(STOP_AT + 2), *STOPPED_ARGS)
    try:
        assert end(resumed, timeout=180) == 0, resumed_output.read_text(errors="replace")
    finally:
        kill_launcher(resumed, folder)
    assert f"resumed from {folder / RUN_ID / 'checkpoints' / f'step-{STOP_AT:08d}.pt'} at step {STOP_AT}" in \
        resumed_output.read_text(errors="replace")


def control_plane(probe: Path) -> tuple[dict[str, int], dict[str, int], list[tuple[int, int]]]:
    """What the probes of one run counted: the collectives distqa's code made on a rank other than 0 (each
    ``collective:NAME:distqa:PHASE`` with its count and, separately, its bytes sent and received), and for each
    agent its watcher's store operations with the watcher's reads."""
    records = [json.loads(path.read_text()) for path in probe.glob("*.json")]
    worker = next(r for r in records if r["role"] == "worker" and r["rank"] == 1)
    ours = {key: count for key, count in worker["calls"].items() if key.startswith("collective:") and ":distqa:" in key}
    agents = [(sum(count for key, count in r["calls"].items() if key.startswith("store:") and ":distqa:" in key),
               len(r["watcher_reads"])) for r in records if r["role"] == "agent"]
    return ours, {key: worker["bytes"][key] for key in ours}, agents


def test_the_control_plane_per_rank_at_8_nodes_is_what_it_is_at_2(tmp_path_factory: pytest.TempPathFactory) -> None:
    """docs/SCALING.md: what distqa's code adds to a rank's collectives and store traffic does not grow with the node
    count. The two stopped runs above trained the same steps and saved the same checkpoints; a rank other than 0
    made the same collectives in each phase, and moved about the same bytes (only rank 0 gathers what grows with the
    ranks: the places of the preflight, the log window), and each agent's rendezvous watcher made at most two store
    requests per read (the state, and the nodes' announcements when a new node appears) plus its own announcement and
    the first call of torch's state reader (C10dRendezvousBackend's constructor sets the state's key if absent)."""
    two_calls, two_bytes, two_agents = control_plane(stopped_run(tmp_path_factory, 2, "ctrl-c")[0] / "probe")
    eight_calls, eight_bytes, eight_agents = control_plane(
        stopped_run(tmp_path_factory, 8, "sigterm-to-the-launcher")[0] / "probe")
    assert two_calls and eight_calls == two_calls
    for key, sent_and_received in eight_bytes.items():
        if key.startswith("collective:all_gather:distqa:steps"):  # the log window: 104 bytes a rank, on purpose
            continue  # (MetricsWindow.flush: every rank meets a lost peer in it)
        assert sent_and_received <= 1.25 * two_bytes[key] + 64, (key, sent_and_received, two_bytes[key])
    assert len(two_agents) == 2 and len(eight_agents) == 8
    for ops, reads in two_agents + eight_agents:
        assert reads > 0 and ops <= 2 * reads + 2, (ops, reads)  # + its announcement, + torch's reader's first call


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
