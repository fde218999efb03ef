"""No node whose loss ends the run (issue 34 part 4): with the c10d rendezvous store hosted outside the training nodes
(``python -m distqa.launch.rendezvous_store``, ``worker.sh --external-store``), node 0, which by default hosts the
store, is lost for good in a 3-node run with ``--min-nodes 2``: the other two go on from the newest checkpoint and end
with the weights of an uninterrupted run. Real torchrun agents, a real SIGKILL of node 0's agent and worker
(INJECT_FAULT kill-node), a real c10d rendezvous on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from support.compare import final_weights, max_difference
from support.processes import free_port
from support.rendezvous import start_store, wait_for_line
from support.runs import RENDEZVOUS, finish, node_output, start_node
from support.shared_runs import ELASTIC_NODE_ARGS, elastic_reference
from support.shared_runs import ELASTIC_TRAINER_ARGS as TRAINER_ARGS

# tests/distributed/test_elastic.py's runs (12 examples per step split by 3 ranks and by 2, dropout off, short
# rendezvous timings), every node a client of the store.
NODE_ARGS = (*ELASTIC_NODE_ARGS, "--external-store")
# Armed on node 0 only, whatever global rank its worker gets in the first round (torch orders the nodes by
# address and pid): node 0 is lost after step 6; the newest checkpoint is step 4's.
NODE_0_LOST = ",".join(f"kill-node:rank={rank}:step=6" for rank in range(3))


def test_node_0_lost_for_good_leaves_two_that_end_as_the_uninterrupted_run(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    port = free_port()
    store = start_store(port, tmp_path / "store.out")
    processes = [store]
    try:
        wait_for_line(tmp_path / "store.out", "serving the rendezvous store", store)
        nodes = [start_node(rank, 3, port, "lost", tmp_path, *NODE_ARGS, trainer_args=TRAINER_ARGS, **RENDEZVOUS,
                            **({"INJECT_FAULT": NODE_0_LOST} if rank == 0 else {})) for rank in range(3)]
        processes += nodes
        # The uninterrupted run, shared with tests/distributed/test_elastic.py, trains beside these (or is done
        # already).
        reference = elastic_reference(tmp_path_factory)
        for process in nodes:
            finish(process, timeout=240)
    finally:
        for process in processes:
            if process.poll() is None and process is not store:
                os.killpg(process.pid, signal.SIGKILL)
        store.send_signal(signal.SIGTERM)
        finish(store, timeout=60)
    outputs = [node_output(tmp_path, "lost", rank).read_text() for rank in range(3)]
    # node 0's process (its worker.sh, exec'd into its agent) SIGKILLed by the fault
    assert [node.returncode for node in nodes] == [-signal.SIGKILL, 0, 0], "\n".join(outputs)
    assert store.returncode == 0, (tmp_path / "store.out").read_text()
    everything = "\n".join(outputs)
    assert f"rendezvous 127.0.0.1:{port} (an external store)" in outputs[0]
    assert re.search(r"fault injection \(INJECT_FAULT\): kill-node rank \d after step 6 now", outputs[0])
    run_dir = tmp_path / "lost"
    # The survivors saved step 6, the last they completed (distqa.training.peer_loss): no step is done twice.
    assert f"resumed from {run_dir / 'checkpoints' / 'step-00000006.pt'}" in everything
    rounds = re.findall(r"membership: round \d+: (\d+) node\(s\) \((.*?)\), world size (\d+)", everything)
    assert [(nodes_, size) for nodes_, _, size in rounds] == [("3", "3"), ("2", "2")], everything
    assert "node 0" not in rounds[1][1], f"node 0 was lost, yet it is in the second round: {rounds[1][1]}"
    # The new rank 0 (on node 1 or 2) wrote the checkpoints after the loss, in the same run directory.
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").glob("step-*.pt"))
    assert checkpoints[-1] == "step-00000014.pt", checkpoints
    difference = max_difference(final_weights(reference), final_weights(run_dir))
    assert difference < 1e-5, f"the run that lost node 0 differs from the uninterrupted one by {difference:.2e}"
