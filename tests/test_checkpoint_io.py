"""Checkpoint I/O at scale (issue 24): saves off the training step (the step after a save starts before its write
ends; a full disk in a background write still ends the run at the next save, the previous checkpoint intact), a
graceful stop on slow storage ending with complete checkpoints, exit 75 and an exact resume, resume reading the
checkpoint once per node (2 emulated nodes × 2 processes, opens and bytes read counted per rank), and the stop's
deadline: the first write compared with the window torchrun or worker.sh leaves, with a warning naming both.

The slow storage is bench/slow_storage.py: every byte still goes through distqa.atomic_files.atomic_write into the real
file, each write call held for as long as its bytes take at the given bandwidth."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.staging import DefaultStager

import distqa.checkpoint.format
import distqa.checkpoint.writer
from distqa.checkpoint.format import Progress, TrainingCheckpoint, verify_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path, list_checkpoints
from distqa.checkpoint.writer import CheckpointWriter
from distqa.distributed.runtime import local_runtime
from distqa.distributed.stop import StopWindow, graceful_stop_window
from distqa.errors import DiskFullError
from distqa.settings.sources import load_config
from distqa.tasks import make_task

from conftest import (
    MACHINERY_ARGS,
    REPO_ROOT,
    WORKER,
    clean_env,
    final_weights,
    finish,
    free_port,
    max_difference,
    node_in_process,
    node_output,
    run_training,
    start_node,
)

sys.path.insert(0, str(REPO_ROOT / "bench"))
import slow_storage
from our_trainer import build_our_trainer  # the trainer as distqa.train builds it
from slow_storage import slow_checkpoint_storage

SMALL_STEPS = ("--global-batch-size", "8", "--per-rank-batch-size", "8", "--warmup-steps", "1", "--log-every", "1",
               "--max-steps", "1000000")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for a trainer run in this process (on a shared 2-core machine two threads spin-wait
    for each other: steps of seconds instead of tens of milliseconds); the previous number is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def a_trainer(tmp_path: Path, *flags: str):
    """The real Trainer over the machinery task's model, one process, checkpoints into tmp_path."""
    config = load_config([*MACHINERY_ARGS, *SMALL_STEPS, *flags], environ={}, dotenv_path=os.devnull)
    return build_our_trainer(config, local_runtime("cpu"), make_task(config).train_dataset(), tmp_path)


@pytest.mark.usefixtures("one_torch_thread")
# --- saves off the step ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("background", [True, False], ids=["background", "blocking"])
def test_the_step_after_a_save_starts_before_its_write_ends(
        background: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in storage holds the write of step 2's checkpoint until step 3 has started. In the background
    that happens at once; a trainer that waits for its writes (checkpoint_in_background false, the control) never
    starts step 3 meanwhile, so the storage gives up after 1 s and the order shows the step waiting."""
    trainer = a_trainer(tmp_path, "--max-steps", "4", "--checkpoint-every", "2",
                        "--checkpoint-in-background", str(background).lower())
    events: list[str] = []
    step_3_started = threading.Event()
    train_step, save = trainer.train_step, distqa.checkpoint.writer.save_checkpoint

    def recorded_step(micro_batches):
        events.append(f"step {trainer.progress.step + 1} starts")
        if trainer.progress.step + 1 == 3:
            step_3_started.set()
        return train_step(micro_batches)

    def held_save(state, path: Path) -> None:
        if path.name == "step-00000002.pt":
            step_3_started.wait(timeout=60 if background else 1)  # background: a hang guard
        save(state, path)
        events.append(f"{path.name} written")

    trainer.train_step = recorded_step
    monkeypatch.setattr(distqa.checkpoint.writer, "save_checkpoint", held_save)
    trainer.fit(SimpleNamespace(writer=None))

    step_3, written = events.index("step 3 starts"), events.index("step-00000002.pt written")
    assert (step_3 < written) == background, events
    # The end of the run waited for the last write; every file is complete, the older one pruned after it.
    assert events[-1] == "step-00000004.pt written"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002.pt", "step-00000004.pt"]
    assert all(verify_checkpoint(p) for p in list_checkpoints(tmp_path))
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


@pytest.mark.usefixtures("one_torch_thread")
def test_a_full_disk_in_a_background_write_ends_the_run_at_the_next_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write of step 4 fails with ENOSPC in the writer's thread; the next save (step 6) raises the DiskFullError
    in the training thread, naming the file and the folder; step 2's checkpoint is intact and nothing else is left."""
    trainer = a_trainer(tmp_path, "--max-steps", "8", "--checkpoint-every", "2", "--keep-checkpoints", "1")
    real_save = torch.save

    def full_disk_at_step_4(obj, f) -> None:
        if obj["progress"]["step"] == 4:
            f.write(b"PK\x03\x04 the first bytes of the archive")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", full_disk_at_step_4)
    with pytest.raises(DiskFullError, match=r"no space left in .*checkpoints \(.* free\) while writing "
                                            r"step-00000004.pt; what was there before is intact"):
        trainer.fit(SimpleNamespace(writer=None))
    assert trainer.progress.step == 6, "raised at the save after the failed write"
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 2)]
    assert verify_checkpoint(checkpoint_path(tmp_path, 2))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002.pt",
                                                                              "step-00000002.pt.crc32"]


# --- the deadline ------------------------------------------------------------------------------------------------
def a_checkpoint(megabytes: float, step: int = 1) -> TrainingCheckpoint:
    return TrainingCheckpoint(
        model={"w": torch.zeros(int(megabytes * 1e6 / 4))}, config={"run_name": "r"}, task_state=None, evaluation=None,
        progress=Progress(step=step), versions={}, optimizer={"state": {}}, scheduler={}, scaler={}, rng=[{}],
        world_size=1, saved_by_rank=0)


class StorageClock:
    """Time that passes only when the stand-in storage takes it (its sleeps add up here, and the writer's
    perf_counter reads the sum): a write's measured seconds are exactly its bytes at the storage's bandwidth,
    whatever the machine's speed or load."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("background", [True, False], ids=["background", "blocking"])
def test_a_write_slower_than_the_stop_window_is_warned_about_once_with_the_numbers_and_the_fix(
        background: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MB at 2 MB/s takes 0.5 s (on the storage's clock); a stop may wait for a write in flight and then write its
    own (1 s), more than a 0.6 s window in the background (blocking: one write, 0.5 s, fits)."""
    clock = StorageClock()
    monkeypatch.setattr(slow_storage, "time", SimpleNamespace(sleep=clock.sleep))
    monkeypatch.setattr(distqa.checkpoint.writer, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    window = StopWindow(0.6, "the 0.6 s of a test (NAME_OF_IT)", "a longer NAME_OF_IT")
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"), background=background, stop_window=window)
    with caplog.at_level(logging.INFO, logger="distqa.checkpoint.writer"), slow_checkpoint_storage(2.0), \
            writer.finishing():
        for step in (1, 2):
            writer.submit({checkpoint_path(tmp_path, step): a_checkpoint(1.0, step)})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    measured = f"step-00000001.pt is 1.0 MB, written in 0.5 s (2 MB/s to {tmp_path / 'checkpoints'})"
    if not background:
        assert warnings == []
        assert f"checkpoint write: {measured}; a graceful stop needs up to 0.5 s of writing, within the 0.6 s of a " \
            "test" in caplog.text, caplog.text
        return
    assert len(warnings) == 1, warnings
    [warning] = warnings
    assert warning.startswith(f"a graceful stop may not save its checkpoint in time: {measured}; "), warning
    assert "after the write in flight if any, up to 1 s, more than the 0.6 s of a test (NAME_OF_IT)" in warning
    assert "Fix: a faster volume for output_dir, a longer NAME_OF_IT (over 1 s)" in warning
    assert "a larger checkpoint_every" in warning


@pytest.mark.parametrize("single_use", [True, False], ids=["a-stager-per-save", "one-stager-reused"])
def test_background_saves_survive_a_torch_whose_stager_is_single_use(single_use: bool, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 2.13, torch's ``DefaultStager._stage`` ends with ``self._state_dict_stager.close()``, which clears the
    copy's dispatch table, so a second ``stage`` fails with ``KeyError: <class 'type'>`` (an H100 with torch 2.11, at
    the second background save). The stand-in stage does what that one does; the writer then needs a stager per save."""
    real_stage = DefaultStager._stage

    def stage_then_close(self: DefaultStager, state_dict: dict, **kwargs: object) -> dict:
        staged = real_stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)
    monkeypatch.setattr(distqa.checkpoint.writer, "_STAGER_IS_SINGLE_USE", single_use)
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"))
    with writer.finishing():
        writer.submit({checkpoint_path(tmp_path, 1): a_checkpoint(0.1, 1)})
        if not single_use:  # the stand-in is as strict as torch 2.11: reusing its stager fails as it failed there
            with pytest.raises(KeyError, match="<class 'type'>"):
                writer.submit({checkpoint_path(tmp_path, 2): a_checkpoint(0.1, 2)})
            return
        for step in (2, 3):
            writer.submit({checkpoint_path(tmp_path, step): a_checkpoint(0.1, step)})
    assert [path.name for path in list_checkpoints(tmp_path)] == [f"step-0000000{step}.pt" for step in (1, 2, 3)]
    for path in list_checkpoints(tmp_path):
        verify_checkpoint(path)


def test_a_write_within_the_window_is_one_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"), stop_window=StopWindow(1e6, "a long window", "n/a"))
    with caplog.at_level(logging.INFO, logger="distqa.checkpoint.writer"), writer.finishing():
        writer.submit({checkpoint_path(tmp_path, 1): a_checkpoint(0.1)})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "checkpoint write: step-00000001.pt is 0.1 MB" in caplog.text and "within a long window" in caplog.text


@pytest.mark.parametrize(("environ", "seconds", "named"), [
    ({}, None, None),  # not started by torchrun, no life span: nobody is known to SIGKILL it
    ({"TORCHELASTIC_RUN_ID": "r"}, 30, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),  # torchrun's default
    ({"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 90, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
    ({"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90", "PET_SHUTDOWN_TIMEOUT": "45"}, 45,
     "PET_SHUTDOWN_TIMEOUT"),  # --shutdown-timeout's variable comes first
    ({"WORKER_STOP_WINDOW_S": "360"}, 360, "WORKER_STOP_WINDOW_S"),
    ({"TORCHELASTIC_RUN_ID": "r", "WORKER_STOP_WINDOW_S": "12"}, 12, "WORKER_STOP_WINDOW_S"),  # the shorter
])
def test_the_stop_window_is_the_shorter_of_torchruns_and_worker_shs(environ: dict[str, str], seconds: float | None,
                                                                    named: str | None) -> None:
    window = graceful_stop_window(environ)
    assert (window.seconds if window else None) == seconds
    assert window is None or f"({named})" in window.what


@pytest.mark.parametrize(("options", "exported"), [(["--life-span", "600"], "60"),
                                                   (["--life-span", "1h", "--stop-after", "50m"], "600"),
                                                   (["--stop-after", "50m"], None), ([], None)])
def test_worker_sh_exports_the_time_between_its_stop_and_the_end_of_the_life_span(
        options: list[str], exported: str | None, tmp_path: Path) -> None:
    """The node in this process up to its agent, whose environment is kept instead of starting it
    (conftest.node_in_process)."""
    agent_env: dict[str, str] = {}
    result = node_in_process(["--nproc-per-node", "1", *options, "--", "--output-dir", str(tmp_path)], clean_env(),
                             agent_env=agent_env)
    assert result.returncode == 0, result.stderr
    assert agent_env.get("WORKER_STOP_WINDOW_S") == exported


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


@pytest.mark.distributed
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


@pytest.mark.distributed
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


@pytest.mark.distributed
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
