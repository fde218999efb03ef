"""What starting a node costs, before and after worker.sh became a shim over one Python process (issue 55).

    .venv/bin/python bench/node_startup.py [--before REV] [--repeats 3]

Side by side, on this checkout's ``src/`` (the torchrun agent and the trainer are the same code in both): worker.sh
as it was at REV (the bash script that started Python 3–7 times before the agent, which it ran as a child), and
worker.sh now (one process: the node's checks, then torchrun's agent in it). Two measures, the CPU-seconds of every
process each one starts (user + system, ``getrusage(RUSAGE_CHILDREN)``), the median of ``--repeats`` runs each:

- a node's work before its agent: ``--dry-run`` of node 1 of 2 (everything but the wait for node 0 and the agent);
- a short run of 2 nodes on this machine, as ``scripts/run_distributed_locally.sh`` starts them (the machinery task,
  2 steps, one process per node): both nodes' worker.sh, agents and workers;
- the same run with an elastic range (``--min-nodes 1``), whose check against the global batch loads the trainer's
  settings and task (torch) before the agent: a process of its own before, the agent's process now.

Prints each figure and the ratio now / before. Ratios matter, not absolute numbers: the machine may be busy.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BEFORE = "7620932"
"""The last commit whose scripts/worker.sh was the whole bash script."""
TRAINER_ARGS = ["--task", "examples.text_classification.task:TextClassification", "--preset", "none",
                "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
                "--max-steps", "2", "--global-batch-size", "8", "--per-rank-batch-size", "4", "--checkpoint-every", "0"]


def children_cpu_s(run: Callable[[], None]) -> float:
    """User + system CPU-seconds of the processes ``run`` starts and waits for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def old_checkout(root: Path, rev: str) -> Path:
    """A folder whose scripts/worker.sh is REV's, beside this checkout's scripts/common.sh and examples/ (the old script
    runs this checkout's src/ through PYTHON)."""
    (root / "scripts").mkdir()
    script = subprocess.run(["git", "show", f"{rev}:scripts/worker.sh"], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=True).stdout
    (root / "scripts" / "worker.sh").write_text(script)
    (root / "scripts" / "common.sh").symlink_to(REPO_ROOT / "scripts" / "common.sh")
    (root / "examples").symlink_to(REPO_ROOT / "examples")
    return root / "scripts" / "worker.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(output_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTQA_", "PET_", "SKYPILOT_"))}
    return env | {"PYTHON": sys.executable, "NODE_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "NODE_CORES": "1",
                  "HF_HUB_OFFLINE": "1", "DISTQA_OUTPUT_DIR": str(output_dir)}


def dry_run(worker: Path, output_dir: Path) -> None:
    subprocess.run(["bash", str(worker), "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                    "--nproc-per-node", "1", "--run-id", "bench", "--dry-run", "--", *TRAINER_ARGS],
                   env=environment(output_dir), capture_output=True, check=True, timeout=300)


def two_nodes(worker: Path, output_dir: Path, *flags: str) -> None:
    port, nodes = free_port(), []
    for rank in (0, 1):
        nodes.append(subprocess.Popen(
            ["bash", str(worker), "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--nproc-per-node", "1", "--run-id", f"bench-{port}", *flags, "--",
             *TRAINER_ARGS],
            env=environment(output_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for node in nodes:
        _, err = node.communicate(timeout=600)
        if node.returncode != 0:
            raise SystemExit(f"a node of {worker} ended with {node.returncode}:\n{err[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help=f"the revision of the old worker.sh (default {BEFORE})")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "old").mkdir()
        workers = {"before": old_checkout(root / "old", args.before), "now": REPO_ROOT / "scripts" / "worker.sh"}
        figures: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):  # alternated, so that a busy moment does not fall on one side only
            for name, worker in workers.items():
                figures.setdefault(("node before its agent (--dry-run)", name), []).append(
                    children_cpu_s(lambda worker=worker: dry_run(worker, root / "runs")))
                figures.setdefault(("2-node run of 2 steps, all processes", name), []).append(
                    children_cpu_s(lambda worker=worker: two_nodes(worker, root / "runs")))
                figures.setdefault(("the same, elastic (--min-nodes 1)", name), []).append(
                    children_cpu_s(lambda worker=worker: two_nodes(worker, root / "runs", "--min-nodes", "1")))
    print(f"CPU-seconds (user + system, median of {args.repeats}); worker.sh before: {args.before}, now: this checkout")
    for measure in dict.fromkeys(what for what, _ in figures):
        before = statistics.median(figures[measure, "before"])
        now = statistics.median(figures[measure, "now"])
        print(f"  {measure:40s} before {before:6.2f}   now {now:6.2f}   now/before {now / before:.2f}")


if __name__ == "__main__":
    main()
