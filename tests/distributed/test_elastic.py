"""Elastic membership (issue 34): a run of 3 emulated nodes with ``worker.sh --min-nodes 2`` (torchrun's
``--nnodes 2:3``). A node lost for good leaves the other two to go on at world size 2 from the newest checkpoint;
a node started again makes the run grow back to 3. Both end with the weights of an uninterrupted 3-rank run
(dropout off: see docs/FAULT_TOLERANCE.md for dropout on). Real torchrun agents, real SIGKILLs (INJECT_FAULT
kill-node), a real c10d rendezvous on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import RENDEZVOUS, finish, node_output, start_node
from support.shared_runs import ELASTIC_NODE_ARGS as NODE_ARGS
from support.shared_runs import ELASTIC_TRAINER_ARGS as TRAINER_ARGS
from support.shared_runs import elastic_reference

LOST = "kill-node:rank=2:step=6"  # after step 6: the newest checkpoint is step 4's, the survivors save step 6
# Returned: the two go on at world size 2 and rank 0 waits after step 10 until torchrun restarts it for the
# round the returned node joins, so the run grows back at a known step whatever the machine's speed.
RETURNED = f"{LOST},pause:rank=0:step=10"


def survivors_said(output: str) -> list[str]:
    """The one line each surviving rank printed when it lost its peer (distqa.training.peer_loss), in rank order."""
    found = re.findall(r"distqa\.train: (rank \d+: lost a peer during .*)", output)
    return sorted(found)


def assert_the_survivors_saved_step_6(output: str) -> None:
    """Both survivors name where the peer was lost and the step they hold; one wrote it, the other left it to that
    rank (distqa.training.peer_loss's claim) or, coming after the claim was released, found it on disk; no
    traceback on the way."""
    lines = survivors_said(output)
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1"], output
    assert all(" after optimizer step 6 (gloo: connection " in line for line in lines), lines
    outcomes = [line.rsplit("; ", 1)[1] for line in lines]
    assert outcomes.count("saved step 6 for the resume") == 1, lines
    other = next((outcome for outcome in outcomes if outcome != "saved step 6 for the resume"), None)
    assert other in ("another survivor saves step 6 for the resume",
                     "step 6 is saved already (step-00000006.pt) for the resume"), lines
    assert "Traceback" not in output, output


def membership(output: str) -> list[tuple[int, int]]:
    """(nodes, world size) of each membership line of rank 0."""
    return [(int(m[1]), int(m[2])) for m in re.finditer(r"membership: round \d+: (\d+) node\(s\) \(.*?\), world "
                                                        r"size (\d+)", output)]


def launch_locally(root: Path, run_id: str, fault: str) -> subprocess.Popen[str]:
    """scripts/run_distributed_locally.sh --nodes 3 --min-nodes 2: the launcher leaves the others running when a
    node ends with an error. Its output (every node's lines, prefixed) goes to ``root/<run_id>.out``."""
    with (root / f"{run_id}.out").open("a") as sink:
        return subprocess.Popen(
            ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", "3", "--min-nodes", "2",
             "--max-restarts", "3", "--port", str(free_port()), "--run-id", run_id, "--", *MACHINERY_ARGS,
             "--output-dir", str(root), *TRAINER_ARGS],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", INJECT_FAULT=fault,
                                         RDZV_JOIN_TIMEOUT="60", **RENDEZVOUS),
            stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three runs side by side (much of the elastic runs' time is waiting): the uninterrupted reference, the
    node lost for good (through the local launcher), the node lost and returned (worker.sh per node, so that the
    test can start the lost one again)."""
    root = tmp_path_factory.mktemp("elastic")
    lost = launch_locally(root, "lost", LOST)
    port = free_port()
    nodes = [start_node(rank, 3, port, "returned", root, *NODE_ARGS, trainer_args=TRAINER_ARGS, INJECT_FAULT=RETURNED,
                        **RENDEZVOUS) for rank in range(3)]
    processes = [lost, *nodes]
    try:
        # The uninterrupted run, shared with tests/distributed/test_rendezvous_store.py, trains beside these (or is done
        # already).
        reference = elastic_reference(tmp_path_factory)
        # The node whose agent the fault killed is started again with the same arguments once the other two hold at
        # step 10 (rank 0's pause).
        wait_for((root / "returned" / "logs" / "rank-0.fault").exists, timeout=240)
        dead = next(rank for rank, node in enumerate(nodes) if node.poll() is not None)
        again = start_node(dead, 3, port, "returned", root, *NODE_ARGS, trainer_args=TRAINER_ARGS,
                           INJECT_FAULT=RETURNED, **RENDEZVOUS)
        processes.append(again)
        for process in processes:
            finish(process, timeout=240)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert lost.returncode == 0, (root / "lost.out").read_text()
    # Every node ended well but the one the fault killed (its worker.sh, exec'd into its agent, SIGKILLed).
    codes = sorted(process.returncode for process in [*nodes, again])
    assert codes == [-signal.SIGKILL, 0, 0, 0], f"exit codes {codes}"
    return {"root": root, "reference": reference}


def test_a_node_lost_for_good_leaves_two_that_end_as_the_uninterrupted_run(runs: dict[str, Path]) -> None:
    root = runs["root"]
    everything = (root / "lost.out").read_text()
    assert re.search(r"node \d exited with status 137; the other 2 node\(s\) go on \(--min-nodes 2\)", everything)
    assert "fault injection (INJECT_FAULT): kill-node rank 2 after step 6 now" in everything
    assert_the_survivors_saved_step_6(everything)
    # The survivors' save: the run redoes no step (before it, it went back to step 4 and redid steps 5 and 6).
    assert f"resumed from {root / 'lost' / 'checkpoints' / 'step-00000006.pt'}" in everything
    assert membership(everything) == [(3, 3), (2, 2)], everything
    assert "world size 3, global batch 12 = shares of 4 per rank × 3 ranks, 2 micro-batches of 2" in everything
    assert "world size 2, global batch 12 = shares of 6 per rank × 2 ranks, 3 micro-batches of 2" in everything
    difference = max_difference(final_weights(runs["reference"]), final_weights(root / "lost"))
    assert difference < 1e-5, f"the run that lost a node differs from the uninterrupted one by {difference:.2e}"


def test_a_node_started_again_makes_the_run_grow_back_and_end_as_the_uninterrupted_run(
        runs: dict[str, Path]) -> None:
    root = runs["root"]
    everything = "\n".join(node_output(root, "returned", rank).read_text() for rank in range(3))
    assert membership(everything) == [(3, 3), (2, 2), (3, 3)], everything
    assert_the_survivors_saved_step_6(everything)
    assert f"resumed from {root / 'returned' / 'checkpoints' / 'step-00000006.pt'}" in everything
    assert "stopped by SIGTERM at step" in everything, "torchrun's restart for the new round: a checkpoint there"
    difference = max_difference(final_weights(runs["reference"]), final_weights(root / "returned"))
    assert difference < 1e-5, f"the run that lost a node and grew back differs by {difference:.2e}"
