"""Checkpoint I/O at scale (issue 24) in real runs: a graceful stop on slow storage ending with complete checkpoints,
exit 75 and an exact resume; resume reading the checkpoint once per node (2 emulated nodes × 2 processes, opens and
bytes read counted per rank); a node that cannot see the checkpoint stopping every rank in one line.

The slow storage is bench/slow_storage.py: every byte still goes through checkpoint.files.atomic_write into the real
file, each write call held for as long as its bytes take at the given bandwidth."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.format import verify_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path, list_checkpoints

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import MACHINERY_ARGS, REPO_ROOT, WORKER
from support.runs import finish, node_output, run_training, start_node

# --- a graceful stop on slow storage ------------------------------------------------------------------------------
SIGTERM_MID_WRITE = """
import os, signal, sys, threading, time
sys.path.insert(0, os.environ["BENCH_DIR"])
from slow_storage import slow_checkpoint_storage
from distqa.distributed.stop import StopSignal
from distqa.train import main

checked, sent, agreed, first_write = threading.Event(), threading.Event(), threading.Event(), []
real_agreed = StopSignal.agreed
GUARD_S = 120  # hang guards only: each wait below ends on an event


def agreed_noted(self, step):  # the run's own check on rank 0, in order with the write of sigterm_mid_write:
    if sent.is_set():  # the SIGTERM is on its way through the agent: this check waits until it is here, so the
        deadline = time.monotonic() + GUARD_S  # stop lands at this step however slowly the signal travels
        while not self.received and time.monotonic() < deadline:
            time.sleep(0.01)
    in_flight = bool(first_write)  # read before the set below: sigterm_mid_write then waits for that set
    received = real_agreed(self, step)
    (agreed if received else checked).set()
    if not received and in_flight:  # the write is in flight: no step passes until its SIGTERM is sent
        sent.wait(timeout=GUARD_S)
    return received


def sigterm_mid_write():  # rank 0's first checkpoint write: the platform's SIGTERM reaches the agent mid-write,
    if not first_write:   # and the write stays in flight until the ranks have agreed to stop
        checked.clear()   # (before first_write is noted: a check noted after it is one after this write began)
        first_write.append(True)
        checked.wait(timeout=GUARD_S)  # a check both ranks passed after this write began: the stop then lands on a
        sent.set()                     # later step (sent at once, it could reach both ranks before the check of
        os.kill(os.getppid(), signal.SIGTERM)  # the step written)
        agreed.wait(timeout=GUARD_S)


StopSignal.agreed = agreed_noted
with slow_checkpoint_storage(float(os.environ["MB_PER_S"]), sigterm_mid_write):
    sys.exit(main())
"""
"""An entry module: the real run on slow storage, with a SIGTERM that lands while a checkpoint is being written."""
# Word vectors of 8192 numbers: a checkpoint of about 5 MB (weights and Adam's two moments), over a second to write
# at 4 MB/s, so the first write is longer than the 1 s stop window by its bytes alone.
STOP_ARGS = ["--max-steps", "12", "--checkpoint-every", "4", "--stop-check-every", "1", "--global-batch-size", "8",
             "--per-rank-batch-size", "4", "--embedding-dim", "8192"]


def test_a_sigterm_during_a_slow_write_ends_with_complete_checkpoints_exit_75_and_an_exact_resume(
        tmp_path: Path) -> None:
    """One node × 2 processes through worker.sh (the platform's command). SIGTERM reaches the agent while rank 0
    writes step 4's checkpoint at 4 MB/s; the ranks agree to stop at the next step, whose save waits for step 4's
    write (and says so), writes its own, and only then do the workers exit 75. Both files verify; the run resumed
    from the newest ends with the weights of an uninterrupted run. With a 1 s stop window (WORKER_STOP_WINDOW_S),
    the first write's time is warned about."""
    (tmp_path / "sigterm_mid_write.py").write_text(SIGTERM_MID_WRITE)
    stopped = subprocess.run(
        ["bash", WORKER, "--nproc-per-node", "2", "--run-id", "stopped", "--entry-module", "sigterm_mid_write", "--",
         *MACHINERY_ARGS, "--output-dir", str(tmp_path), *STOP_ARGS],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path),
                                     BENCH_DIR=str(REPO_ROOT / "bench"), MB_PER_S="4", WORKER_STOP_WINDOW_S="1"),
        capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 75, stopped.stderr
    checkpoints = tmp_path / "stopped" / "checkpoints"
    [*_, newest] = list_checkpoints(tmp_path / "stopped")
    step = torch.load(newest, weights_only=True)["progress"]["step"]
    assert 4 < step < 12 and newest == checkpoint_path(tmp_path / "stopped", step)
    assert list_checkpoints(tmp_path / "stopped") == [checkpoint_path(tmp_path / "stopped", 4), newest]
    assert all(verify_checkpoint(p) for p in list_checkpoints(tmp_path / "stopped")), "complete and CRC-verified"
    assert not list(checkpoints.glob(".*.tmp"))
    assert f"stopped by SIGTERM at step {step}, checkpoint {newest} written; exit code 75" in stopped.stderr
    rank_0 = (tmp_path / "stopped" / "logs" / "rank-0.log").read_text()
    assert f"before saving step-{step:08d}.pt: at most one checkpoint write is in flight" in rank_0
    assert "waited" in rank_0 and "for the write of step-00000004.pt" in rank_0
    assert "a graceful stop may not save its checkpoint in time: step-00000004.pt is" in rank_0
    assert "the 1 s that worker.sh --life-span leaves between its stop and the end of the job" in rank_0

    run_training([*MACHINERY_ARGS, "--output-dir", str(tmp_path), "--run-name", "stopped", *STOP_ARGS], nproc=2)
    run_training([*MACHINERY_ARGS, "--output-dir", str(tmp_path), "--run-name", "uninterrupted", *STOP_ARGS], nproc=2)
    difference = max_difference(final_weights(tmp_path / "stopped"), final_weights(tmp_path / "uninterrupted"))
    assert difference < 1e-6, f"the run resumed after the stop differs by {difference:.2e}"


# --- resume reads once per node ----------------------------------------------------------------------------------
AUDITED_RESUME = """
import json, os, sys
from pathlib import Path
import distqa.train
from distqa.train import main

opened = []


def audit(event, args):  # Python's open() and os.open() (torch.load of a path opens it so too), as they were called
    if event == "open" and isinstance(args[0], str | bytes | os.PathLike) and os.fsdecode(args[0]).endswith(".pt"):
        opened.append(os.fsdecode(args[0]))


def rchar():  # bytes this process has read through read() and the like, from any file (not sockets: gloo's recv)
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("rchar")).split()[1])


resume = distqa.train.resume


def audited_resume(config, runtime, *args):
    opened.clear()
    before = rchar()
    try:
        return resume(config, runtime, *args)
    finally:
        audit_file = Path(os.environ["AUDIT_DIR"]) / f"rank-{runtime.rank}.json"
        audit_file.write_text(json.dumps({"node": runtime.node_rank, "opened": opened, "read": rchar() - before}))


sys.addaudithook(audit)
distqa.train.resume = audited_resume
sys.exit(main())
"""
"""An entry module that counts, on each rank, the opens of checkpoint files and the bytes read during resume."""


def test_resume_reads_the_checkpoint_once_per_node(tmp_path: Path) -> None:
    """A 4-rank run of 2 steps (one torchrun: it only leaves the checkpoint), then the same run to step 3 on 2
    emulated nodes × 2 processes through the local launcher, resuming from step 2's checkpoint. On each node exactly
    one rank opens it, once, and reads its bytes once; the node's other rank opens no checkpoint and reads less than
    half of it; every rank resumes at step 2."""
    (tmp_path / "audited_resume.py").write_text(AUDITED_RESUME)
    audit = tmp_path / "audit"
    audit.mkdir()

    run = [*MACHINERY_ARGS, "--output-dir", str(tmp_path), "--global-batch-size", "16", "--per-rank-batch-size", "4",
           "--embedding-dim", "2048"]  # a checkpoint of about 1.3 MB: the bytes a resume reads are its own
    run_training([*run, "--run-name", "audited", "--max-steps", "2"], nproc=4)
    resumed = subprocess.run(
        ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--procs-per-node", "2", "--port",
         str(free_port()), "--run-id", "audited", "--entry-module", "audited_resume", "--", *run, "--max-steps", "3"],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, PYTHONPATH=str(tmp_path), AUDIT_DIR=str(audit)),
        capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    checkpoint = checkpoint_path(tmp_path / "audited", 2)
    size = checkpoint.stat().st_size
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in audit.glob("rank-*.json")}
    assert sorted(ranks) == [0, 1, 2, 3]
    for node in (0, 1):
        on_node = {rank: audit for rank, audit in ranks.items() if audit["node"] == node}
        readers = [rank for rank, audit in on_node.items() if audit["opened"]]
        assert len(on_node) == 2 and len(readers) == 1, ranks
        [reader] = readers
        assert on_node[reader]["opened"] == [str(checkpoint)], "one open of the checkpoint per node"
        assert size <= on_node[reader]["read"] < 2 * size, f"read once ({size} bytes): {on_node[reader]}"
        [other] = set(on_node) - {reader}
        assert on_node[other]["read"] < size / 2, f"rank {other} read from storage: {on_node[other]}"
    logs = [(tmp_path / "audited" / "logs" / f"rank-{rank}.log").read_text() for rank in range(4)]
    assert all(f"resumed from {checkpoint} at step 2" in log for log in logs)


LINGERING_REFUSAL = """
import os, signal, socket, sys, time
from distqa.train import main

code = main()
signal.signal(signal.SIGTERM, lambda *_: os._exit(code))  # the agent stopping this worker, in its shutdown
deadline = time.monotonic() + 60  # a hang guard: each wait below ends on an event
while time.monotonic() < deadline:  # until node 0's agent has ended and its rendezvous store with it
    try:
        socket.create_connection(("127.0.0.1", int(os.environ["STORE_PORT"])), timeout=1).close()
    except OSError:
        break
    time.sleep(0.1)
time.sleep(max(0.0, deadline - time.monotonic()))  # until this node's agent finds the store gone and stops it
sys.exit(code)
"""
"""An entry module whose worker, having refused, outlives the other node's agent and its store: a worker slow to exit
on a busy machine, made certain. Its agent's next check (``SimpleElasticAgent._invoke_run``: num_nodes_waiting) then
raises a RendezvousConnectionError rather than seeing the worker fail."""


def test_a_node_that_cannot_see_the_checkpoint_stops_every_rank_in_one_line(tmp_path: Path) -> None:
    """Node 1 runs in a mount namespace of its own with an empty tmpfs over the results folder (output_dir not
    on storage every node mounts). Rank 0 picks the checkpoint a one-process run left; node 1 cannot read it, and
    both ranks end with the same line naming node 1 and the fix, before any training. Node 1's worker outlives node
    0's store (LINGERING_REFUSAL), and node 1 still ends with the workers' code and no traceback."""
    (tmp_path / "lingering_refusal.py").write_text(LINGERING_REFUSAL)
    results = tmp_path / "results"
    results.mkdir()
    namespace = ["unshare", "--mount", "--map-root-user"] if os.geteuid() else ["unshare", "--mount"]
    probe = subprocess.run([*namespace, "mount", "-t", "tmpfs", "tmpfs", str(results)], capture_output=True, text=True,
                           timeout=30)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    run_training([*MACHINERY_ARGS, "--output-dir", str(results), "--run-name", "unshared", "--max-steps", "1"])
    checkpoint = checkpoint_path(results / "unshared", 1)

    port = free_port()
    node_0 = start_node(0, 2, port, "unshared", results)
    with (tmp_path / "node-1.out").open("w") as sink:
        node_1 = subprocess.Popen(
            [*namespace, "sh", "-c", f'mount -t tmpfs tmpfs {results} && exec "$@"', "sh", "bash", WORKER, "--nnodes",
             "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), "--run-id", "unshared",
             "--nproc-per-node", "1", "--entry-module", "lingering_refusal", "--", *MACHINERY_ARGS, "--output-dir",
             str(results), "--max-steps", "2"],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
                                         PYTHONPATH=str(tmp_path), STORE_PORT=str(port)),
            stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    finish(node_0, timeout=180)
    finish(node_1, timeout=60)
    line = (f"distqa.train: configuration error: cannot resume from {checkpoint}: node 1 (rank 1): {checkpoint} cannot "
            f"be read ([Errno 2] No such file or directory: '{checkpoint}'). Every node must see the run directory "
            "(output_dir on storage that all nodes mount); use --resume none to start fresh.")
    for output in (node_output(results, "unshared", 0).read_text(), (tmp_path / "node-1.out").read_text()):
        assert line in output.splitlines(), output
        assert "ChildFailedError" not in output and "Traceback" not in output, "the workers said why: no traceback"
    assert node_0.returncode == 2 and node_1.returncode == 2, "worker.sh ends with the workers' code, not torchrun's 1"
