"""Real launches of the trainer (``python -m distqa.train``, torchrun, an emulated node's ``scripts/worker.sh``),
their hang guards and kills, and a worker that acts at a step it reaches (:data:`AT_STEP`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT, WORKER

AT_STEP = """
import os, signal, sys, time
from distqa.training.trainer import Trainer
from distqa.train import main

train_step = Trainer.train_step


def act_once_at_step(self, micro_batches):  # the run's own step; at a known step of one rank, the test's action
    acted = os.environ.get("ACTED_FILE")  # once per run across processes (a worker restarted by torchrun)
    rank = os.environ.get("RANK", "0")
    if self.progress.step == int(os.environ["AT_STEP"]) and rank == os.environ.get("AT_RANK", "0") \
            and os.environ.get("AT_RUN", self.run_dir.name) == self.run_dir.name \
            and not os.environ.get("ACTED") and not (acted and os.path.exists(acted)):
        os.environ["ACTED"] = "1"
        if acted:
            open(acted, "w").close()
        if os.environ["SIGNAL"] == "RAISE":
            raise RuntimeError("a crash the test injected")
        target = os.environ["TARGET_PID"]  # "self", "parent" (the torchrun agent), a pid (negative: a group)
        pid = {"self": os.getpid(), "parent": os.getppid()}.get(target) or int(target)
        os.kill(pid, getattr(signal, os.environ["SIGNAL"]))
        # The agent forwards it to this worker (AT_WAIT_STOP: so does the launcher the pid runs, a sweep's): hold the
        # step until it is here, however slow.
        if target == "parent" or os.environ.get("AT_WAIT_STOP"):
            # the StopSignal distqa.distributed.stop installed
            stop = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
            deadline = time.monotonic() + 120
            while not stop.received and time.monotonic() < deadline:
                time.sleep(0.01)
    return train_step(self, micro_batches)


Trainer.train_step = act_once_at_step
sys.exit(main())
"""
"""``python -m distqa.train`` that, at optimizer step AT_STEP of rank AT_RANK (default 0), sends SIGNAL to
TARGET_PID (or raises): a signal at a step the run reaches, with no race with the clock. AT_RUN: only in the run
directory of that name (a sweep's trial-001). Write it to ``at_step.py``
in a folder on PYTHONPATH and start it as the launchers' ``--entry-module at_step`` (tests/distributed/test_tracking.py,
tests/distributed/test_training.py)."""


def run_training(args: list[str], nproc: int = 1, cwd: Path = REPO_ROOT, timeout: int = 240,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m distqa.train`` in a fresh process, or under ``torchrun --standalone`` for nproc > 1."""
    result = subprocess.run(training_command(nproc) + args, cwd=cwd, env=env or clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        # The lines that say why first: a CI report may keep only the start and the end of a long output.
        why = [line for line in result.stderr.splitlines() if FAILURE_LINE.search(line)][:12]
        raise AssertionError(f"training failed ({result.returncode}):\n" + "".join(f"  {line}\n" for line in why)
                             + f"{result.stdout}\n{result.stderr}")
    return result


FAILURE_LINE = re.compile(r"terminate called|what\(\):|Fatal Python error|Error:|error:|exitcode *: *-?[1-9]")
"""Lines of a failed run's output that name its cause: a C++ abort, a Python exception, torchrun's failure table."""


def start_training(args: list[str], log: Path, nproc: int = 1, cwd: Path = REPO_ROOT,
                   env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """:func:`run_training`'s run in the background (a reference run beside the one a test interrupts), its output
    appended to ``log``, in a session of its own (``os.killpg`` ends it with its workers)."""
    with log.open("a") as sink:
        return subprocess.Popen(training_command(nproc) + args, cwd=cwd, env=env or clean_env(OMP_NUM_THREADS="1"),
                                stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def training_command(nproc: int) -> list[str]:
    """``python -m distqa.train``, under ``torchrun --standalone`` for nproc > 1."""
    if nproc == 1:
        return [sys.executable, "-m", "distqa.train"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
            "distqa.train"]


def start_node(node_rank: int, nnodes: int, port: int, run_id: str, output_dir: Path, *extra: str,
               trainer_args: Sequence[str] = ("--max-steps", "2"), **env: str) -> subprocess.Popen[str]:
    """One emulated node: ``scripts/worker.sh`` with one process on 127.0.0.1, in a session of its own
    (``os.killpg`` ends the whole node: worker.sh, its torchrun agent and its workers). Its output is
    appended to ``output_dir/<run_id>-node-<node_rank>.out`` (a file, not a pipe that could fill up). It trains the
    machinery task; ``env`` adds variables (INJECT_FAULT)."""
    with node_output(output_dir, run_id, node_rank).open("a") as sink:
        return subprocess.Popen(
            ["bash", WORKER, "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--run-id", run_id, "--nproc-per-node", "1", *extra, "--",
             *MACHINERY_ARGS, "--output-dir", str(output_dir), *trainer_args],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1", OMP_NUM_THREADS="1", **env),
            stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def node_output(output_dir: Path, run_id: str, node_rank: int) -> Path:
    return output_dir / f"{run_id}-node-{node_rank}.out"


def finish(process: subprocess.Popen[str], timeout: float) -> None:
    """Wait for ``process``; it and its session are SIGKILLed after ``timeout`` s."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def sigint_as_in_a_terminal() -> None:
    """SIGINT back to its default in the launcher, as a terminal's shell gives it. A command started in the background
    by a non-interactive shell (``make test &``, ``nohup``) inherits SIGINT ignored, and bash can neither trap nor
    reset a signal ignored when it starts: the launcher's Ctrl-C handler would never run (seen under a CI run started
    with ``&``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_launcher(launcher: subprocess.Popen, output_dir: Path | None = None) -> None:
    """SIGKILL a launcher that still runs (a test's hang guard, after a failure) and every process under it. The
    local launcher starts each node in a session of its own (a terminal's Ctrl-C must reach the launcher alone), so
    ``os.killpg`` on the launcher would leave its nodes running: they are found as its descendants first, and, with
    ``output_dir``, as any live process with it in its command line (a node's agent or worker whose parent died
    before, no longer under the launcher)."""
    if launcher.poll() is not None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        processes = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    for pid in processes_of(output_dir) if output_dir else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_of(output_dir: Path) -> list[int]:
    """Live processes with ``output_dir`` in their command line: a node's worker.sh, agent and workers."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(output_dir).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def training_process(rank: int, output_dir: Path, module: str = "distqa.train") -> int | None:
    """PID of a live worker of ``module`` with RANK=rank whose --output-dir is ``output_dir`` (a test's
    tmp_path, so that another test run on the same machine is never the one signalled); not its agent."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in cmdline and b"distqa.launch.agent" not in cmdline \
                and b"torch.distributed.run" not in cmdline \
                and f"RANK={rank}".encode() in environ and str(output_dir).encode() in cmdline:
            return int(proc.name)
    return None



def train(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m distqa.train ARGV`` in a process of its own, its output kept whatever its exit status (unlike
    :func:`run_training`, which requires success)."""
    return subprocess.run([sys.executable, "-m", "distqa.train", *argv], cwd=REPO_ROOT,
                          env=env or clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)


# Short rendezvous timings (worker.sh passes them to torchrun's c10d rendezvous): a round completes 1 s after its
# minimum has joined, and a dead node leaves the rendezvous after 3 missed 1-s heartbeats.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}

