"""A node lost and returned (issue 14 item 5): a whole emulated node (worker.sh, its torchrun agent and
its worker) is SIGKILLed mid-run and started again with the same arguments. The other node's agent
(--max-restarts > 0) restarts its worker into a new rendezvous round, the returned node joins it, both
resume from the newest checkpoint, and the run ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from support.compare import final_weights, max_difference
from support.processes import free_port, wait_for
from support.runs import finish, node_output, start_node, training_process
from support.shared_runs import forty_steps_of_2_ranks, forty_steps_uninterrupted

# Node 1's rank frozen (SIGSTOP) right after step 12, once per run directory: the node is killed in a state the run
# reaches and stays in (node 0 waits in step 13's all-reduce), past the checkpoint of step 10, not a race with a
# machine fast enough to finish first.
FROZEN = "hang:rank=1:step=12"


def test_a_node_killed_and_started_again_rejoins_and_the_run_ends_as_if_uninterrupted(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    port = free_port()
    node_args = ("--max-restarts", "2", "--join-timeout", "60")
    trainer_args = (*forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "10")

    def start(rank: int):
        return start_node(rank, 2, port, "node-loss", tmp_path, *node_args, trainer_args=trainer_args,
                          INJECT_FAULT=FROZEN)

    nodes = [start(0), start(1)]
    try:
        # The uninterrupted run, shared with test_training.py and test_faults.py, trains beside the nodes (or is done
        # already): much of their time is waiting (the frozen rank, the dead node's rendezvous keep-alive running
        # out, the returned node's start). Its folder is not under tmp_path, so that training_process(1, tmp_path)
        # finds node 1's worker, never the reference's rank 1.
        uninterrupted = forty_steps_uninterrupted(tmp_path_factory)
        wait_for((tmp_path / "node-loss" / "checkpoints" / "step-00000010.pt").exists, timeout=180)
        wait_for((tmp_path / "node-loss" / "logs" / "rank-1.fault").exists, timeout=180)
        # The whole node: worker.sh and its agent (the node's session), and its worker (torchrun starts
        # workers in sessions of their own, so it would outlive its agent).
        worker = wait_for(lambda: training_process(1, tmp_path), timeout=10)
        os.killpg(nodes[1].pid, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)
        nodes[1].wait(timeout=30)
        returned = start(1)
        nodes.append(returned)
        finish(returned, timeout=240)
        finish(nodes[0], timeout=60)
    finally:
        for process in nodes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    output_0 = node_output(tmp_path, "node-loss", 0).read_text()
    output_1 = node_output(tmp_path, "node-loss", 1).read_text()
    assert nodes[0].returncode == 0, output_0
    assert returned.returncode == 0, output_1
    assert "resumed from" in output_1, "the returned node resumed from a checkpoint"
    assert "restarting" in output_0.lower() or "resumed from" in output_0, "node 0's agent restarted its worker"

    difference = max_difference(final_weights(uninterrupted), final_weights(tmp_path / "node-loss"))
    assert difference < 1e-6, f"the run whose node was lost and returned differs by {difference:.2e}"
