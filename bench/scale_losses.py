"""Many losses at once, and one during the recovery: ``python bench/scale.py --many-losses``.

16 nodes of one process on 127.0.0.1 with an external rendezvous store and ``--min-nodes 8`` train 16 steps of the
machinery task (dropout off, a global batch of 32, a checkpoint every 4 steps). After step 8, four nodes are lost at
once (``INJECT_FAULT=kill-node`` on ranks 0, 5, 10 and 15: rank 0's node is among them, the rank that writes the
checkpoints and serves the workers' process-group store); as soon as a survivor has said it lost a peer, one more node
is killed from outside, while the survivors re-form. The run must go on with 11 nodes, whose world size does not split
the global batch evenly (shares of 3 and 2), and end with the weights of one process that trained the same 16 steps
uninterrupted, to 1e-5.

Checked and printed: every survivor's one line, the one save of step 8 among the survivors (the others leave it to
the rank that claimed it or find it on disk), the resume at step 8, the last round's world size, the weights' largest
difference, and the time from the losses to the first step after them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from scale import (
    REPO_ROOT,
    TASK,
    checkpoint_at,
    environment,
    free_port,
    records,
    rendezvous_store,
    wait_all,
)

NODES, MIN_NODES, STEPS, LOSS_AT, EVERY = 16, 8, 16, 8, 4
LOST_RANKS = (0, 5, 10, 15)
GLOBAL_BATCH = 32
LAST_CALL_S = "20"
"""Longer than the 16 nodes take to start on 2 cores (docs/SCALING.md: a shorter last call restarts the first round)."""
TOLERANCE = 1e-5


def trainer_args(output: Path) -> list[str]:
    return [*TASK, "--output-dir", str(output), "--global-batch-size", str(GLOBAL_BATCH), "--max-steps", str(STEPS),
            "--checkpoint-every", str(EVERY), "--checkpoint-format", "file"]


def reference(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of one process that trained the same steps, never interrupted."""
    output = folder / "reference"
    subprocess.run([sys.executable, "-m", "distqa.train", *trainer_args(output), "--run-name", "reference"],
                   cwd=REPO_ROOT, env=environment(folder / "no-probe") | {"SCALE_PROBE_DIR": ""}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    return final_weights(output / "reference")


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    path = checkpoint_at(run_dir / "checkpoints", STEPS, ".pt")
    if path is None:
        raise SystemExit(f"bench/scale_losses.py: no checkpoint of step {STEPS} in {run_dir}/checkpoints")
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def many_losses(folder: Path) -> int:
    """Run the scenario in ``folder``; 0 when every check held, 1 otherwise."""
    probe_dir = folder / "losses" / "probe"
    probe_dir.mkdir(parents=True)
    output = folder / "losses" / "results"
    fault = ",".join(f"kill-node:rank={rank}:step={LOSS_AT}" for rank in LOST_RANKS)
    port = free_port()
    nodes: list[subprocess.Popen[bytes]] = []
    with rendezvous_store(port):
        for node in range(NODES):
            command = [str(REPO_ROOT / "scripts" / "worker.sh"), "--nnodes", str(NODES), "--min-nodes", str(MIN_NODES),
                       "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                       "--run-id", "losses", "--max-restarts", "3", "--external-store", "--", *trainer_args(output)]
            log = open(folder / "losses" / f"node-{node}.log", "wb")  # noqa: SIM115 (the child holds it)
            nodes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                          env=environment(probe_dir, SCALE_NODE=str(node), INJECT_FAULT=fault,
                                                          RDZV_LAST_CALL_TIMEOUT=LAST_CALL_S),
                                          start_new_session=True))
        one_more = kill_one_more_when_the_survivors_reform(folder / "losses", nodes)
        codes = wait_all(nodes, 1800)
    return report(folder, output / "losses", codes, one_more, records(probe_dir))


def kill_one_more_when_the_survivors_reform(folder: Path, nodes: list[subprocess.Popen[bytes]]) -> int | None:
    """Once every survivor's line says it lost a peer, SIGKILL one of them (its whole process group: worker.sh, its
    agent, its worker), as a machine lost during the new rendezvous. Returns its node rank; the survivors' lines as
    they were then are kept in ``first-round.log``."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        texts = [(folder / f"node-{node}.log").read_text(errors="replace") for node in range(NODES)]
        said = [node for node, text in enumerate(texts) if "lost a peer during" in text]
        if len(said) >= NODES - len(LOST_RANKS):
            (folder / "first-round.log").write_text("".join(texts))
            victim = said[-1]
            os.killpg(nodes[victim].pid, signal.SIGKILL)
            print(f"[losses] node {victim} killed while the survivors re-form", file=sys.stderr, flush=True)
            return victim
        time.sleep(0.2)
    return None


def report(folder: Path, run_dir: Path, codes: list[int], one_more: int | None, procs: list[dict]) -> int:
    first_round = folder / "losses" / "first-round.log"
    output = first_round.read_text(errors="replace") if first_round.is_file() else ""
    lines = re.findall(r"distqa\.train: (rank (\d+): lost a peer during .*)", output)
    by_rank: dict[str, int] = {}
    for _, rank in lines:
        by_rank[rank] = by_rank.get(rank, 0) + 1
    saved = sum("saved step 8 for the resume" in line for line, _ in lines)
    rank0_log = (run_dir / "logs" / "rank-0.log").read_text(errors="replace") if (run_dir / "logs").is_dir() else ""
    resumed = re.findall(r"resumed from .* at step (\d+)", rank0_log)
    rounds = re.findall(r"membership: round \d+: (\d+) node\(s\).*world size (\d+)", rank0_log)
    lost_walls = [p["step_walls"][-1] for p in procs if p.get("role") == "worker" and p.get("world_size") == NODES
                  and p.get("rank") in LOST_RANKS and p.get("step_walls")]
    after = [p["marks"]["first_step_wall"] for p in procs if p.get("role") == "worker"
             and (p.get("world_size") or NODES) < NODES and "first_step_wall" in p.get("marks", {})]
    recovery_s = min(after) - max(lost_walls) if after and lost_walls else float("nan")
    difference = max((a.float() - b.float()).abs().max().item()
                     for a, b in zip(final_weights(run_dir).values(), reference(folder).values(), strict=True))
    checks = {
        f"every survivor said it lost a peer, once ({len(by_rank)} ranks)":
            len(by_rank) == NODES - len(LOST_RANKS) and set(by_rank.values()) == {1},
        f"one save of step {LOSS_AT} among the survivors ({saved})": saved == 1,
        f"the run resumed at step {LOSS_AT} ({', '.join(resumed) or 'no resume'})": str(LOSS_AT) in resumed,
        f"the last round: {rounds[-1][0] if rounds else '?'} nodes": bool(rounds) and int(rounds[-1][0]) == 11,
        f"the node lost during the recovery: node {one_more}": one_more is not None,
        f"the weights equal one uninterrupted process's: largest difference {difference:.2e}": difference <= TOLERANCE,
        f"the surviving nodes exited 0 ({sum(code == 0 for code in codes)} of {NODES})":
            sum(code == 0 for code in codes) == 11,
    }
    print(f"bench/scale.py --many-losses: {NODES} nodes, --min-nodes {MIN_NODES}, --external-store; ranks "
          f"{', '.join(map(str, LOST_RANKS))} lost after step {LOSS_AT}, then node {one_more} during the recovery")
    print(f"time from the losses to the first step after them: {recovery_s:.1f} s (2 cores shared by every process)")
    for what, held in checks.items():
        print(f"{'PASS' if held else 'MISS'}  {what}")
    print(f"(run kept in {folder / 'losses'})")
    return 0 if all(checks.values()) else 1
