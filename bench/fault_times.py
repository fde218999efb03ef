"""Time to error or to recovery of each fault of docs/FAULT_TOLERANCE.md, measured on loopback (CPU, gloo).

    .venv/bin/python bench/fault_times.py            # every scenario once, about 4 min on 2 cores
    .venv/bin/python bench/fault_times.py elastic    # only the scenarios whose name has this word

Each scenario starts the real scripts (worker.sh → distqa.launch.agent → distqa.train, the machinery task) in a
temporary folder, injects its fault and measures from the fault to the event that ends it: the one-line error and
exit, or the first training step after the run resumed; where the run resumes, also the optimizer steps it does
twice (those between the step it resumed at and the last one completed before the fault). Timeouts are set short
here (join 10 s, collective 10 s); with the defaults (join 900 s, collective 600 s) those scenarios take that much
longer. Prints one table row per scenario.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = str(REPO_ROOT / "scripts" / "worker.sh")
# The machinery task (the example's text classifier: torch only, a step in milliseconds), as the tests train it.
TRAINER = ["--task", "examples.text_classification.task:TextClassification", "--preset", "none",
           "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
           "--global-batch-size", "8", "--per-rank-batch-size", "4"]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("DISTQA_")} | {
    "PYTHON": sys.executable, "NODE_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(out: Path, rank: int, nnodes: int, port: int, *options: str, trainer: tuple[str, ...] = (),
         env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One emulated node (worker.sh, one process) in a session of its own; output appended to a file."""
    with (out / f"node-{rank}.out").open("ab") as sink:
        return subprocess.Popen(
            ["bash", WORKER, "--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--run-id", "bench", "--nproc-per-node", "1", *options, "--", *TRAINER,
             "--output-dir", str(out), *trainer], cwd=REPO_ROOT, env=ENV | (env or {}), stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(condition: Callable[[], object], timeout: float = 180) -> float:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s for {condition}")
        time.sleep(0.1)
    return time.monotonic()


def in_file(path: Path, pattern: str, after: int = 0) -> Callable[[], bool]:
    return lambda: path.exists() and re.search(pattern, path.read_text()[after:]) is not None


def worker_pid(rank: int, out: Path) -> int | None:
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"distqa.train" in cmdline and b"distqa.launch.agent" not in cmdline and f"RANK={rank}".encode() in environ \
                and str(out).encode() in cmdline:
            return int(proc.name)
    return None


def unreachable_master(out: Path) -> float:
    started = time.monotonic()
    node(out, 1, 2, free_port(), "--join-timeout", "10").wait(timeout=120)
    return time.monotonic() - started


def node_never_joins(out: Path) -> float:
    started = time.monotonic()
    node(out, 0, 2, free_port(), "--join-timeout", "10").wait(timeout=120)
    return time.monotonic() - started


def collective_timeout(out: Path) -> float:
    port = free_port()
    nodes = [node(out, r, 2, port, trainer=("--max-steps", "100000", "--dist-timeout-s", "10")) for r in (0, 1)]
    wait_until(in_file(out / "bench" / "logs" / "rank-0.log", r"step 3/"))
    victim = worker_pid(1, out)
    assert victim is not None
    os.kill(victim, signal.SIGSTOP)
    started = time.monotonic()
    ended = wait_until(in_file(out / "node-0.out", "collective timeout"))
    os.kill(victim, signal.SIGKILL)
    for process in nodes:
        os.killpg(process.pid, signal.SIGKILL)
    return ended - started


def graceful_stop(out: Path) -> float:
    port = free_port()
    nodes = [node(out, r, 2, port, trainer=("--max-steps", "100000", "--checkpoint-every", "0")) for r in (0, 1)]
    wait_until(in_file(out / "bench" / "logs" / "rank-0.log", r"step 3/"))
    os.kill(nodes[1].pid, signal.SIGTERM)  # worker.sh of node 1, as the platform or Slurm would
    started = time.monotonic()
    for process in nodes:
        process.wait(timeout=120)
    return time.monotonic() - started


def node_lost_and_returned(out: Path) -> float:
    port = free_port()
    trainer = ("--max-steps", "300", "--checkpoint-every", "10")
    nodes = [node(out, r, 2, port, "--max-restarts", "2", "--join-timeout", "60", trainer=trainer) for r in (0, 1)]
    log = out / "bench" / "logs" / "rank-0.log"
    wait_until((out / "bench" / "checkpoints" / "step-00000010.pt").exists)
    victim = worker_pid(1, out)
    assert victim is not None
    offset = len(log.read_text())
    os.killpg(nodes[1].pid, signal.SIGKILL)
    os.kill(victim, signal.SIGKILL)
    started = time.monotonic()
    nodes[1].wait(timeout=30)
    nodes.append(node(out, 1, 2, port, "--max-restarts", "2", "--join-timeout", "60", trainer=trainer))
    resumed = wait_until(in_file(log, r"resumed from[^\n]*\n(.*\n)*.*step \d+/300", offset))
    for process in nodes:
        process.wait(timeout=180)
    return resumed - started


# Elastic membership (worker.sh --min-nodes): 3 nodes, at least 2; 12 examples per step split over 2 or 3 ranks.
# The rendezvous settings of tests/distributed/test_elastic.py: a round closes 1 s after its minimum has joined, a dead
# node leaves the rendezvous after 3 missed 1-s heartbeats (torch's defaults: 30 s and 5 × 3 s).
ELASTIC_OPTIONS = ("--min-nodes", "2", "--max-restarts", "3", "--join-timeout", "60")
ELASTIC_TRAINER = ("--max-steps", "300", "--checkpoint-every", "10", "--global-batch-size", "12",
                   "--per-rank-batch-size", "2")
ELASTIC_ENV = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3",
               "INJECT_FAULT": "kill-node:rank=2:step=12"}


def elastic_node_lost(out: Path, returns: bool) -> float:
    """3 nodes, --min-nodes 2: the node of rank 2 lost after step 12 (its agent and worker SIGKILLed); the time
    from the loss to the first step of the run that goes on (2 nodes), or, when the node is started again at
    once, to the first step back at 3 nodes."""
    port = free_port()
    nodes = [node(out, r, 3, port, *ELASTIC_OPTIONS, trainer=ELASTIC_TRAINER, env=ELASTIC_ENV) for r in range(3)]
    log = out / "bench" / "logs" / "rank-0.log"
    wait_until((out / "bench" / "logs" / "rank-2.fault").exists)
    started, offset = time.monotonic(), len(log.read_text())
    wait_until(lambda: any(process.poll() is not None for process in nodes))
    if returns:
        lost = next(rank for rank, process in enumerate(nodes) if process.poll() is not None)
        nodes.append(node(out, lost, 3, port, *ELASTIC_OPTIONS, trainer=ELASTIC_TRAINER, env=ELASTIC_ENV))
    size = 3 if returns else 2
    resumed = wait_until(in_file(log, rf"membership: round \d+: {size} node[^\n]*\n(.*\n)*.*step \d+/300", offset))
    # The workers first: torchrun starts them in sessions of their own.
    for pid in filter(None, (worker_pid(rank, out) for rank in range(3))):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for process in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return resumed - started


# A lost peer (distqa.training.peer_loss): the node of rank 2 lost after step 17 with checkpoints every 5, the
# survivors saving the step they completed, or not (save_on_peer_loss false: the resume goes back to the newest
# checkpoint, step 15).
LOSS_TRAINER = ("--max-steps", "300", "--checkpoint-every", "5", "--global-batch-size", "12", "--per-rank-batch-size",
                "2")
LOSS_ENV = ELASTIC_ENV | {"INJECT_FAULT": "kill-node:rank=2:step=17"}


def steps_redone_after_a_lost_node(out: Path, save: bool) -> tuple[float, int]:
    """3 nodes, --min-nodes 2, the node of rank 2 lost after step 17: the seconds from the loss to the first step
    at 2 nodes, and the steps done twice (17 less the step the run resumed at)."""
    port, trainer = free_port(), (*LOSS_TRAINER, "--save-on-peer-loss", "true" if save else "false")
    nodes = [node(out, r, 3, port, *ELASTIC_OPTIONS, trainer=trainer, env=LOSS_ENV) for r in range(3)]
    log = out / "bench" / "logs" / "rank-0.log"
    wait_until((out / "bench" / "logs" / "rank-2.fault").exists)
    started, offset = time.monotonic(), len(log.read_text())
    resumed = wait_until(in_file(log, r"membership: round \d+: 2 node[^\n]*\n(.*\n)*.*step \d+/300", offset))
    resumed_at = int(re.search(r"resumed from \S+ at step (\d+)", log.read_text()[offset:])[1])
    for pid in filter(None, (worker_pid(rank, out) for rank in range(3))):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for process in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return resumed - started, 17 - resumed_at


SCENARIOS = {
    "unreachable master (join timeout 10 s): start → exit 3": unreachable_master,
    "node never joins (join timeout 10 s): start → exit 4": node_never_joins,
    "collective timeout (dist_timeout_s 10): SIGSTOP of rank 1 → rank 0's line": collective_timeout,
    "graceful stop (stop_check_every 10): SIGTERM to node 1 → both nodes exit 75": graceful_stop,
    "node lost and returned at once: SIGKILL of node 1 → first step after the resume": node_lost_and_returned,
    "elastic, node lost for good (3 nodes, --min-nodes 2, last call 1 s, keep-alive 1 s × 3): SIGKILL of a node → "
    "first step at 2 nodes": lambda out: elastic_node_lost(out, returns=False),
    "elastic, node lost and returned at once (the same): SIGKILL of a node → first step back at 3 nodes":
        lambda out: elastic_node_lost(out, returns=True),
    "lost peer, the survivors save (the same 3 nodes; lost after step 17, checkpoints every 5): SIGKILL → first step "
    "at 2 nodes": lambda out: steps_redone_after_a_lost_node(out, save=True),
    "lost peer, no save (save_on_peer_loss false; the same): SIGKILL → first step at 2 nodes":
        lambda out: steps_redone_after_a_lost_node(out, save=False),
}


def main() -> int:
    print("| scenario | seconds | steps redone |\n|---|---|---|")
    for name, scenario in SCENARIOS.items():
        if len(sys.argv) > 1 and sys.argv[1] not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="fault-times-") as folder:
            measured = scenario(Path(folder))
        seconds, redone = measured if isinstance(measured, tuple) else (measured, None)
        print(f"| {name} | {seconds:.1f} | {'—' if redone is None else redone} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
