"""Graceful stop: SIGTERM or SIGINT is only recorded; at a step boundary the ranks agree (a one-element all-reduce,
MAX, every ``stop_check_every`` steps: a signal reaches only the workers of the node whose agent got it), rank 0
writes a checkpoint of that step, and every process exits with :data:`STOPPED_EXIT_CODE`. A second signal ends the
process at once (a worker blocked in a collective with a dead peer cannot reach a step boundary), except under a
scheduler that signals every process of the step (:data:`STEP_SIGNALS_VARIABLE`).

Who sends the signal, how long the stop has before SIGKILL (:func:`graceful_stop_window`, which the checkpoint
writer, :mod:`distqa.checkpoint.writer`, compares with its first write) and the line each stopped process writes to
``$WORKER_STOP_REPORT_DIR/rank-<R>`` for ``scripts/worker.sh``: docs/FAULT_TOLERANCE.md, "How the signal travels".
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch

from distqa.distributed.runtime import all_reduce_max

STOPPED_EXIT_CODE = 75
"""Exit code of a worker that stopped on a signal after writing a checkpoint: EX_TEMPFAIL of
``sysexits.h`` ("try again later"): start the run again with the same run name to resume."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPORT_DIR_VARIABLE = "WORKER_STOP_REPORT_DIR"
WORKER_WINDOW_VARIABLE = "WORKER_STOP_WINDOW_S"
"""Seconds between ``worker.sh``'s own stop (``--life-span``, ``--stop-after``) and the end of the job's life span,
exported by ``worker.sh`` when it knows both."""
TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT_S = 30
STEP_SIGNALS_VARIABLE = "WORKER_STEP_SIGNALS"
"""``1`` where the scheduler signals every process of the job step, the workers with their agents, which pass their
own on (``scripts/train_slurm.sbatch``; docs/SLURM.md): a repeated signal is then the same stop and is ignored."""


class TrainingStoppedError(Exception):
    """Raised out of the loop once every rank has agreed to stop and the checkpoint is written."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path) -> None:
        super().__init__(f"stopped by {signal_name} at step {step} with checkpoint {checkpoint}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint

    def report(self, rank: int) -> str:
        """The one line this process prints, and writes for ``scripts/worker.sh``."""
        return (f"stopped by {self.signal_name} at step {self.step}, checkpoint {self.checkpoint} written; exit "
                f"code {STOPPED_EXIT_CODE}. Start the run again with the same run name to resume (rank {rank})")

    def write_report(self, rank: int) -> None:
        folder = os.environ.get(REPORT_DIR_VARIABLE)
        if folder and Path(folder).is_dir():
            (Path(folder) / f"rank-{rank}").write_text(self.report(rank) + "\n")


class StopSignal:
    """Records SIGTERM/SIGINT while installed; :meth:`agreed` is the collective check."""

    def __init__(self, device: torch.device, every: int) -> None:
        self.device, self.every = device, every
        self.received = 0
        """Number of the first signal received, 0 if none."""
        self.repeats_are_one_stop = os.environ.get(STEP_SIGNALS_VARIABLE) == "1"
        """A second signal is the same stop (:data:`STEP_SIGNALS_VARIABLE`), not a forceful one."""

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Handle the stop signals for the duration of the block; the previous handlers come back after.
        Python runs signal handlers in the main thread only, so elsewhere (a notebook's worker thread)
        nothing is installed and a signal acts as before."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._record) for sig in STOP_SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if self.received and self.repeats_are_one_stop:
            return
        if self.received:  # a second signal: the default action, at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum

    def agreed(self, step: int) -> int:
        """Collective on check steps (every rank calls it after every step): the signal that some rank
        received, or 0 when none did or ``step`` is not a check step."""
        if step % self.every:
            return 0
        return all_reduce_max(self.received, self.device)


@dataclass(frozen=True)
class StopWindow:
    """The time a graceful stop has from its signal to SIGKILL, and where that time is set."""

    seconds: float
    what: str
    """The window in words, with the setting that makes it ("the 30 s torchrun waits … (TORCH_ELASTIC_…)")."""
    fix: str
    """How to make it longer."""


def graceful_stop_window(environ: Mapping[str, str] | None = None) -> StopWindow | None:
    """The shorter of the two deadlines a graceful stop can meet, None when neither applies (a process that
    torchrun did not start, with no life span: nobody is known to SIGKILL it).

    - torchrun's agent (which sets ``TORCHELASTIC_RUN_ID`` for its workers) SIGKILLs its workers
      ``--shutdown-timeout`` s after passing them a SIGTERM: ``PET_SHUTDOWN_TIMEOUT`` (the flag's variable,
      ``torch/distributed/run.py``), else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, else 30
      (``torch/distributed/launcher/api.py``, ``LaunchConfig.__post_init__``); the flag itself is not visible
      here, and ``worker.sh`` does not pass it.
    - ``worker.sh --life-span`` stops the workers ``WORKER_STOP_WINDOW_S`` s before the job's life span ends."""
    environ = os.environ if environ is None else environ
    windows: list[StopWindow] = []
    if "TORCHELASTIC_RUN_ID" in environ:
        name = next((n for n in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") if environ.get(n)),
                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
        seconds = _seconds(environ.get(name), TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT_S)
        if seconds is not None:
            windows.append(StopWindow(
                seconds, f"the {seconds:g} s torchrun waits between SIGTERM and SIGKILL ({name})",
                f"a longer {name} in the environment of worker.sh (the platform: defaults.env of .neuro/live.yml)"))
    seconds = _seconds(environ.get(WORKER_WINDOW_VARIABLE), None)
    if seconds is not None:
        windows.append(StopWindow(seconds, f"the {seconds:g} s that worker.sh --life-span leaves between its stop "
                                           f"and the end of the job ({WORKER_WINDOW_VARIABLE})",
                                  "a longer life span, or an earlier worker.sh --stop-after"))
    return min(windows, key=lambda window: window.seconds, default=None)


def _seconds(raw: str | None, default: float | None) -> float | None:
    """A window in seconds from a variable; ``default`` when unset, None when it is not a number (torchrun
    refuses such a value itself before any worker starts)."""
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        return None
