"""The Kubeflow jobs of deploy/kubernetes (issue 36) run with each engine's environment: two emulated nodes (processes
on 127.0.0.1, the pods' DNS names replaced by 127.0.0.1 as the local launcher does, the engine's port by a free one)
of a TrainJob and of an elastic PyTorchJob train, lose a node, and resume; the doctor under a PyTorchJob's variables
fails a results directory the nodes do not share. The manifests against their schemas and the variables each pod
gets: tests/launchers/test_kubernetes.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.processes import free_port, wait_for
from support.repo import REPO_ROOT
from support.runs import finish

sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
from support.kubernetes import SMALL_RUN, manifest, needs_engines, on_this_machine, pod

# --- emulated nodes: a kill and a resume on each engine --------------------------------------------------------------

# 4 steps between checkpoints; node 1's rank frozen (SIGSTOP) right after step 6, once per run directory: the node is
# killed in a state the run reaches and stays in (node 0 waits in step 7's all-reduce), past step 4's checkpoint.
TRAINER_ARGS = [*SMALL_RUN, "--max-steps", "12", "--checkpoint-every", "4", "--classifier-dropout", "0",
                "--stop-check-every", "1"]
FROZEN = "hang:rank=1:step=6"
# An elastic run goes on without the lost node: node 0 alone then waits after step 9 until torchrun restarts it for
# the round the returned node joins (tests/distributed/test_elastic.py's RETURNED), so the run is not over before it
# returns.
HELD = f"{FROZEN},pause:rank=0:step=9"
# Short rendezvous timings for the elastic run (the manifest's 30 s last call; a dead node leaves after 3 missed 1-s
# heartbeats), as tests/distributed/test_elastic.py runs them.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}


def start_pod(resource: dict[str, Any], node: int, port: int, root: Path, **extra: str) -> subprocess.Popen[str]:
    """Node ``node`` of the job on this machine (:func:`on_this_machine`), in a session of its own, its output
    appended to ``root/node-<node>.out``; the same call starts it again, as the engine starts a pod again."""
    argv, env = on_this_machine(resource, *pod(resource, node), port, root, TRAINER_ARGS, **extra)
    with (root / f"node-{node}.out").open("a") as sink:
        return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def kill_and_resume(name: str, root: Path, fault: str = FROZEN, **extra: str) -> tuple[str, str]:
    """Two emulated nodes of the job train; node 1 is lost whole (worker.sh, its agent, its frozen worker) after
    step 4's checkpoint and started again with the same command and environment (once node 0 holds, with
    :data:`HELD`); both must end well. The nodes' outputs."""
    resource = manifest(name)
    port = free_port()
    run_dir = root / resource["metadata"]["name"]
    nodes = [start_pod(resource, node, port, root, INJECT_FAULT=fault, **extra) for node in range(2)]
    returned, frozen_killed = None, False
    try:
        wait_for((run_dir / "checkpoints" / "step-00000004.pt").exists, timeout=180)
        frozen = run_dir / "logs" / "rank-1.fault"
        wait_for(lambda: frozen.exists() and re.search(r"\(pid (\d+)\)", frozen.read_text()), timeout=180)
        worker = int(re.search(r"\(pid (\d+)\)", frozen.read_text())[1])  # the frozen rank, as it wrote there
        os.killpg(nodes[1].pid, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)  # torchrun starts its workers in sessions of their own
        frozen_killed = True
        nodes[1].wait(timeout=30)
        if fault == HELD:
            wait_for((run_dir / "logs" / "rank-0.fault").exists, timeout=180)
        returned = start_pod(resource, 1, port, root, INJECT_FAULT=fault, **extra)
        finish(returned, timeout=240)
        finish(nodes[0], timeout=120)
    finally:
        for process in [*nodes, returned]:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        # A frozen worker outlives its killed agent. It stopped itself, so the pid it wrote is still its own when the
        # test failed before killing it.
        frozen = run_dir / "logs" / "rank-1.fault"
        found = re.search(r"\(pid (\d+)\)", frozen.read_text()) if not frozen_killed and frozen.exists() else None
        if found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(found[1]), signal.SIGKILL)
    outputs = tuple((root / f"node-{node}.out").read_text() for node in range(2))
    assert nodes[0].returncode == 0, outputs[0]
    assert returned.returncode == 0, outputs[1]
    assert "resumed from" in outputs[1], "the returned node resumed from a checkpoint"
    assert (run_dir / "checkpoints" / "step-00000012.pt").exists()
    return outputs


@pytest.mark.parametrize("name", [pytest.param("trainjob.yaml", marks=needs_engines), "pytorchjob.yaml"])
def test_a_jobs_nodes_lose_one_and_resume(name: str, tmp_path: Path) -> None:
    """Trainer v2's PET_* variables, and the training operator's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK with their
    PET_* twins (a Master pod and a Worker pod)."""
    node_0, _ = kill_and_resume(name, tmp_path)
    assert "restarting" in node_0.lower() or "resumed from" in node_0, "node 0's agent restarted its worker"


def test_an_elastic_pytorchjobs_nodes_lose_one_and_resume(tmp_path: Path) -> None:
    """Under the elastic variables (PET_RDZV_*, PET_NNODES 1:2, PET_MAX_RESTARTS): node 0 goes on alone at world
    size 1 from step 4's checkpoint, and the run grows back to 2 when node 1 returns."""
    node_0, _ = kill_and_resume("pytorchjob-elastic.yaml", tmp_path, HELD, **RENDEZVOUS)
    rounds = re.findall(r"membership: round \d+: (\d) node\(s\)", node_0)
    # With 1 s of last call, node 0 may start alone when node 1's agent joins later than that (a busy machine);
    # node 1's arrival then makes the next round 2 nodes before the fault, as it would on a cluster.
    assert rounds in (["2", "1", "2"], ["1", "2", "1", "2"]), node_0


# --- shared storage -------------------------------------------------------------------------------------------------

def test_the_doctor_under_a_pytorchjobs_variables_fails_a_results_directory_that_is_not_shared(tmp_path: Path) -> None:
    """The PyTorchJob's two pods with ``--doctor`` added to the job's worker.sh options; node 1's volume mount is a
    tmpfs of its own (a private mount namespace) at the same path, as a pod whose claim is not ReadWriteMany (or
    not the same claim) has: rank 0's report names rank 1's directory."""
    namespace = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--mount", "--map-root-user"]
    mounts = tmp_path / "mounts"
    mounts.mkdir()
    probe = subprocess.run([*namespace, "mount", "-t", "tmpfs", "tmpfs", str(mounts)], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    resource = manifest("pytorchjob.yaml")
    port = free_port()
    volume = tmp_path / "results"
    nodes = []
    for node in range(2):
        argv, env = on_this_machine(resource, *pod(resource, node), port, volume,
                                    [*SMALL_RUN, "--allreduce-mb", "1", "--timeout-s", "60"])
        argv.insert(argv.index("--"), "--doctor")
        own_mount = [*namespace, "sh", "-c", f'mkdir -p {volume} && mount -t tmpfs tmpfs {volume} && exec "$@"', "sh"]
        nodes.append(subprocess.Popen([*(own_mount if node == 1 else []), *argv], cwd=REPO_ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    try:
        outputs = [node.communicate(timeout=150)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert nodes[0].returncode == 1, outputs[0]
    failures = [line for line in outputs[0].splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 1, "\n".join(failures)
    [failure] = failures
    assert failure.startswith("FAIL rank 1 (") and f"results directory {volume / 'distqa'} is not the one rank 0 sees" \
        in failure and "ReadWriteMany" in failure, failure
