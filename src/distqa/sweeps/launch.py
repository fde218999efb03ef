"""Each trial through the launcher of its cluster, exactly as a user starts a run by hand.

- ``local``: ``scripts/run_distributed_locally.sh`` (``--nodes`` emulated nodes on this machine); a graceful stop
  is one SIGTERM to it (every node checkpoints the step reached, exit 75);
- ``platform``: ``scripts/run_distributed_on_platform.sh`` (``--nodes`` platform jobs); a stop is one SIGTERM to
  it: it kills the trial's jobs, whose workers checkpoint the step reached as the platform stops them (exit 130);
- ``slurm``: one ``sbatch --wait scripts/train_slurm.sbatch`` per trial; a stop is ``scancel --batch --signal=TERM``
  (the batch script sends one SIGTERM to each node's agent: the tasks checkpoint and exit 75, the script with them;
  without ``--batch`` Slurm signals every process of the step, and a worker's second signal ends it at once).

The sweep process runs where it is started (a laptop, a login node, a small CPU job), never on a training node:
the trials are the launchers' jobs. Each launcher starts in a session of its own, so a terminal's Ctrl-C reaches
the sweep alone, which passes one graceful stop to each running trial.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from distqa.config import REPO_ROOT
from distqa.distributed.stop import STOPPED_EXIT_CODE

LauncherName = Literal["local", "platform", "slurm"]
LAUNCHERS: tuple[LauncherName, ...] = ("local", "platform", "slurm")


@dataclass
class Launcher:
    """How trials start and stop on one kind of cluster."""

    name: LauncherName
    nodes: int = 2
    procs_per_node: int = 1
    extra: list[str] = field(default_factory=list)
    """The launcher's own options for every trial (``--launcher-args``: a platform preset, sbatch's --gpus…)."""
    run_id_prefix: str = "sweep"
    """Platform and Slurm run ids: ``<prefix>-t<N>`` (platform job names are short: the prefix is cut to 9)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def run_id(self, number: int) -> str:
        if self.name == "local":
            return f"trial-{number:03d}"
        prefix = re.sub(r"[^a-z0-9]+", "-", self.run_id_prefix.lower()).strip("-")[:9].strip("-") or "sweep"
        return f"{prefix}-t{number}"

    def command(self, number: int, trainer_args: list[str]) -> list[str]:
        """The command that runs trial ``number`` with ``trainer_args`` (the trainer's flags, its run name in them)."""
        scripts = REPO_ROOT / "scripts"
        run_id = self.run_id(number)
        if self.name == "local":
            return ["bash", str(scripts / "run_distributed_locally.sh"), "--nodes", str(self.nodes),
                    "--procs-per-node", str(self.procs_per_node), "--port", str(free_port()), "--run-id", run_id,
                    *self.extra, "--", *trainer_args]
        if self.name == "platform":
            # A rendezvous port of its own: trials side by side never meet on one (the stand-in's jobs share a host).
            return ["bash", str(scripts / "run_distributed_on_platform.sh"), "--nodes", str(self.nodes),
                    "--run-id", run_id, "--port", str(free_port()), *self.extra, "--", *trainer_args]
        return ["sbatch", "--parsable", "--wait", "--nodes", str(self.nodes), "--job-name", run_id,
                f"--export=ALL,RUN_ID={run_id}", *self.extra, str(scripts / "train_slurm.sbatch"), "--",
                *trainer_args]

    def reproduce(self, trainer_args: list[str]) -> str:
        """The command a user runs to train a trial's settings again, outside the sweep (a run name of their own)."""
        if self.name == "local":
            launcher = ["scripts/run_distributed_locally.sh", "--nodes", str(self.nodes)]
            if self.procs_per_node != 1:
                launcher += ["--procs-per-node", str(self.procs_per_node)]
        elif self.name == "platform":
            launcher = ["scripts/run_distributed_on_platform.sh", "--nodes", str(self.nodes), *self.extra]
        else:
            launcher = ["sbatch", "--nodes", str(self.nodes), *self.extra, "scripts/train_slurm.sbatch"]
        return shlex.join([*launcher, "--", *trainer_args])

    def start(self, number: int, trainer_args: list[str], log_path: Path) -> Running:
        """Start trial ``number`` in a session of its own, its output to ``log_path`` (appended: a resumed trial's
        launches follow one another)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = log_path.open("a")
        log.write(f"$ {shlex.join(self.command(number, trainer_args))}\n")
        log.flush()
        # The trials run on the sweep's interpreter (the local launcher's nodes, prepare; a Slurm job's tasks).
        environment = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
        # In the sweep's working directory, as a user starts a launcher (relative paths among the flags mean the
        # same to the trials as to the sweep's checks); train_slurm.sbatch is submitted from the repository.
        process = subprocess.Popen(self.command(number, trainer_args), cwd=REPO_ROOT if self.name == "slurm" else None,
                                   stdout=log, env=environment, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        return Running(number, process, log, log_path, time.monotonic())

    def stop(self, running: Running) -> None:
        """Ask the trial to stop gracefully (a checkpoint of the step it reaches); once."""
        if running.stop_asked or running.process.poll() is not None:
            return
        running.stop_asked = True
        if self.name == "slurm":
            job = slurm_job_id(running.log_path)
            if job:
                subprocess.run(["scancel", "--batch", "--signal=TERM", job], capture_output=True, timeout=60,
                               check=False)
            return
        running.process.send_signal(signal.SIGTERM)

    def outcome(self, code: int, stop_asked: bool) -> Literal["ended", "stopped", "failed"]:
        """What the launcher's exit status says: the run ended (summary.json says how), stopped (resumable: from its
        checkpoint, or from the start when the stop came before one), or failed. Any other end after the sweep
        asked for a stop is a stop too (a launcher signalled before its own handlers were set). The local launcher
        and a Slurm job exit ``STOPPED_EXIT_CODE`` after a graceful stop; the platform launcher 130."""
        if code == 0:
            return "ended"
        if stop_asked:
            return "stopped"
        return "stopped" if code == STOPPED_EXIT_CODE and self.name != "platform" else "failed"


@dataclass
class Running:
    """A trial whose launcher runs."""

    number: int
    process: subprocess.Popen[bytes]
    log: IO[str]
    log_path: Path
    started: float
    stop_asked: bool = False


def slurm_job_id(log_path: Path) -> str:
    """The job id ``sbatch --parsable`` printed first in the trial's log (``123`` or ``123;cluster``)."""
    for line in log_path.read_text(errors="replace").splitlines()[1:3]:
        if re.fullmatch(r"\d+(;\S+)?", line.strip()):
            return line.strip().split(";")[0]
    return ""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a local trial's rendezvous (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_NODE_PREFIX = re.compile(r"^(\[node \d+\] )+")
_TIMESTAMP = re.compile(r"^\d\d:\d\d:\d\d \[rank \d+\] \w+ [\w.]+: ")
_OWN_ERROR = re.compile(r"distqa\.\w+: [a-z ]*(error|timeout|disk full): ")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception)): ")


def failure_reason(log_text: str, code: int) -> str:
    """One line for a failed trial, from its launcher's output: the trainer's own error line (a configuration or
    data error, a collective timeout), else the last Python exception (an out-of-memory error), else the platform
    launcher's line about a failed or cancelled job, else Slurm's state of the trial's job, else the last line; with
    the exit status."""
    lines = [_TIMESTAMP.sub("", _NODE_PREFIX.sub("", line)).strip() for line in log_text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("$ ")]
    own = next((line[m.start():] for line in lines if (m := _OWN_ERROR.search(line))), None)
    exceptions = [line for line in lines if _EXCEPTION.match(line) and "ChildFailedError" not in line]
    platform = next((line.removeprefix("[platform] ") for line in lines if line.startswith("[platform] ")
                     and re.search(r"\b(failed|cancelled|not started|could not)\b", line)), None)
    reason = own or (exceptions[-1] if exceptions else None) or platform or slurm_job_state(lines) \
        or (lines[-1] if lines else "no output")
    reason = reason if len(reason) <= 240 else reason[:237] + "..."
    return f"{reason} (exit {code})"


def slurm_job_state(lines: list[str]) -> str | None:
    """Slurm's word on a trial's job, when the log holds only the id ``sbatch --parsable --wait`` printed: real
    sbatch 22.05 says nothing more about a job that was cancelled, failed or timed out (the job's own output is in
    its slurm-<id>.out), so sacct's state and exit code, e.g. ``Slurm job 12: CANCELLED by 0, exit code 0:15``."""
    job = next((line.split(";")[0] for line in lines if re.fullmatch(r"\d+(;\S+)?", line)), None)
    if job is None or shutil.which("sacct") is None:
        return None
    try:
        result = subprocess.run(["sacct", "--jobs", job, "--allocations", "--noheader", "--parsable2",
                                 "--format=State,ExitCode"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [row.split("|") for row in result.stdout.splitlines() if row.count("|") == 1]
    return f"Slurm job {job}: {rows[-1][0]}, exit code {rows[-1][1]}" if rows else None


def ended_process(running: list[Running], timeout_s: float) -> Running | None:
    """The first of ``running`` whose launcher has ended, waiting up to ``timeout_s``; None when none has."""
    deadline = time.monotonic() + timeout_s
    while True:
        for trial in running:
            if trial.process.poll() is not None:
                return trial
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

