"""No node whose loss ends the run (issue 34 part 4): the c10d rendezvous store hosted outside the training nodes
(``python -m distqa.launch.rendezvous_store``, ``worker.sh --external-store``). Node 0, which by default hosts the
store, is lost for good in a 3-node run with ``--min-nodes 2``: the other two go on from the newest checkpoint and end
with the weights of an uninterrupted run. Real torchrun agents, a real SIGKILL of node 0's agent and worker
(INJECT_FAULT kill-node), a real c10d rendezvous on 127.0.0.1. And the store entry point itself: it serves a client and
exits 0 on SIGTERM; the local launcher's ``--external-store`` starts it and stops it."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from shared_runs import ELASTIC_NODE_ARGS, RENDEZVOUS, elastic_reference
from shared_runs import ELASTIC_TRAINER_ARGS as TRAINER_ARGS
from torch.distributed import TCPStore

from distqa.launch.reachability import probe

from conftest import (
    MACHINERY_ARGS,
    REPO_ROOT,
    clean_env,
    final_weights,
    finish,
    free_port,
    max_difference,
    node_in_process,
    node_output,
    start_node,
    wait_for,
)

# tests/test_elastic.py's runs (12 examples per step split by 3 ranks and by 2, dropout off, short rendezvous
# timings), every node a client of the store.
NODE_ARGS = (*ELASTIC_NODE_ARGS, "--external-store")
# Armed on node 0 only, whatever global rank its worker gets in the first round (torch orders the nodes by
# address and pid): node 0 is lost after step 6; the newest checkpoint is step 4's.
NODE_0_LOST = ",".join(f"kill-node:rank={rank}:step=6" for rank in range(3))


def start_store(port: int, log: Path) -> subprocess.Popen[str]:
    with log.open("a") as sink:
        return subprocess.Popen([sys.executable, "-m", "distqa.launch.rendezvous_store", "--host", "127.0.0.1",
                                 "--port",
                                 str(port)], cwd=REPO_ROOT, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def wait_for_line(log: Path, text: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until ``text`` is in ``log`` (the store's ready line); fails at once if the process ended."""
    def ready() -> bool:
        assert process.poll() is None, log.read_text()
        return text in log.read_text()

    wait_for(ready, timeout=timeout)


@pytest.mark.distributed
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
        # The uninterrupted run, shared with tests/test_elastic.py, trains beside these (or is done already).
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


def test_the_store_serves_a_client_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    store = start_store(port, tmp_path / "store.out")
    try:
        wait_for_line(tmp_path / "store.out", f"serving the rendezvous store on 127.0.0.1:{port}", store)
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("run/key", "value")
        assert TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30)).get("run/key") == b"value"
        del client
        store.send_signal(signal.SIGTERM)
        finish(store, timeout=60)
    finally:
        if store.poll() is None:
            os.killpg(store.pid, signal.SIGKILL)
    assert store.returncode == 0, (tmp_path / "store.out").read_text()
    assert "stopped on signal" in (tmp_path / "store.out").read_text()


def test_a_port_already_taken_is_one_line_and_exit_1(tmp_path: Path) -> None:
    port = free_port()
    first = start_store(port, tmp_path / "first.out")
    try:
        wait_for_line(tmp_path / "first.out", "serving the rendezvous store", first)
        second = subprocess.run([sys.executable, "-m", "distqa.launch.rendezvous_store", "--host", "127.0.0.1",
                                 "--port",
                                 str(port)], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True,
                                timeout=60)
    finally:
        first.send_signal(signal.SIGTERM)
        finish(first, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"distqa.launch.rendezvous_store: cannot serve on 127.0.0.1:{port}: ") \
        and "another --port" in line


def test_the_local_launcher_starts_the_store_first_and_stops_it_at_the_end(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", "2", "--port", str(port),
         "--run-id", "external", "--external-store", "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
         "--max-steps", "1"],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", RDZV_JOIN_TIMEOUT="60"),
        capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"serving the rendezvous store on 127.0.0.1:{port}" in output
    assert output.count(f"rendezvous 127.0.0.1:{port} (an external store)") == 2, output
    assert "stopped on signal" in output  # the launcher's trap ended it; nothing listens on the port any more
    assert probe("127.0.0.1", port) == "refused"


def test_worker_sh_external_store_makes_node_0_a_client_and_needs_the_stores_address(tmp_path: Path) -> None:
    def worker(*extra: str) -> subprocess.CompletedProcess[str]:  # the node in this process (no bash, no start)
        return node_in_process(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--external-store",
                                "--dry-run", *extra, "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path)],
                               clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"))

    refused = worker()
    assert refused.returncode == 2 and "--external-store needs --master-addr" in refused.stderr, refused.stderr
    dry = worker("--master-addr", "store-host", "--master-port", "29555")
    assert dry.returncode == 0, dry.stderr
    torchrun = shlex.split(dry.stdout)
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == "store-host:29555"
    assert torchrun[torchrun.index("--rdzv-conf") + 1].startswith("is_host=0,")
