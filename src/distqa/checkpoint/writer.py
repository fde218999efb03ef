"""Checkpoint writes off the training step: rank 0 copies the step's state to host memory, a thread writes it.

::

    save at step N ─> CheckpointWriter.submit({path: checkpoint})
                        1. waits for the previous write if it is still going (and says so in the log)
                        2. copies the state to host memory: the snapshot of step N, which the optimizer's
                           next step cannot change (the copy is the only part the step waits for)
                        3. a thread writes each file (distqa.checkpoint.format.save_checkpoint), then prunes
    stop or end ───> CheckpointWriter.wait(): the files are complete and durable; the write's error is raised

Each file is written as before: to a temporary name, fsynced, renamed (the folder fsynced), with its
``.crc32`` sidecar; a full disk raises :class:`~distqa.config.errors.DiskFullError` and leaves the previous
complete checkpoint as it was; older step checkpoints are pruned only once a newer one is complete; the
format (:data:`~distqa.checkpoint.format.FORMAT_VERSION`) does not change. At most one write is in flight, so
host memory holds one copy of the state: ``torch.distributed.checkpoint``'s ``DefaultStager`` keeps it and
refills it at every save (in pinned memory on GPUs, so the copy runs at the full speed of the bus). An error of
a background write surfaces in the main thread, at the next save or at the end of the run; a full disk still
ends the run with exit 1 and its message. ``checkpoint_in_background = false`` writes while the training
waits, with no host copy.

The deadline: the first step checkpoint's write is timed, and its bytes / seconds (the results volume's write
bandwidth as the run sees it) is compared once with the time a graceful stop has before SIGKILL
(:func:`distqa.distributed.stop.graceful_stop_window`): a stop may find a write in flight, wait for it, and then write
its own checkpoint, so it needs up to two writes. A warning names the numbers and the fixes when that is
longer than the window.

Why one file from rank 0 rather than ``torch.distributed.checkpoint.async_save`` (torchtitan's ``async_mode``):
docs/FAULT_TOLERANCE.md. DCP's spread-out write is the better choice once the state is sharded (FSDP) or one node
cannot write a checkpoint within the stop window: that is ``checkpoint_format = sharded``
(:mod:`distqa.checkpoint.sharded`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from distqa.checkpoint.format import ModelCheckpoint, TrainingCheckpoint, save_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path, prune_checkpoints
from distqa.distributed.stop import StopWindow

log = logging.getLogger(__name__)

# In torch releases before 2.13 (2.11 among them), DefaultStager._stage closes its StateDictStager after every stage,
# which clears the table its copy dispatches on: the next stage fails with "KeyError: <class 'type'>" (seen on an H100
# with torch 2.11, at the second background save; 2.13's _stage leaves it open). There each save gets a stager of its
# own, and the host copy is not kept between saves.
_STAGER_IS_SINGLE_USE = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13)


class BackgroundWrite:
    """One write at a time, in a thread, from a host copy of what it writes (``DefaultStager``: kept and refilled at
    each write, in pinned memory on GPUs); the error of a write is raised in the main thread by :meth:`wait`."""

    def __init__(self, cuda: bool, name: str) -> None:
        self.cuda, self.name = cuda, name
        self._stager: DefaultStager | None = None
        """Holds the host copy of the state between writes (made at the first)."""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, state: Any, write: Callable[[Any], None]) -> None:
        """``write(copy)`` in a thread, ``copy`` being ``state`` copied to host memory now (one call: tensors that
        ``state`` holds twice are copied once). Call :meth:`wait` first."""
        if self._stager is not None and _STAGER_IS_SINGLE_USE:
            self.close()
        if self._stager is None:
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=self.cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=self.cuda))
        snapshot = self._stager.stage(state)
        self._thread = threading.Thread(target=self._run, args=(write, snapshot), name=self.name)
        self._thread.start()

    def wait(self) -> None:
        """Return once the write in flight, if any, is complete and durable; raise its error (once)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """Free the host copy."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _run(self, write: Callable[[Any], None], snapshot: Any) -> None:
        try:
            write(snapshot)
        except BaseException as err:  # raised in the main thread by wait()
            self._error = err


class CheckpointWriter:
    """Rank 0's checkpoint files, written in a background thread (or, with ``background`` false, at once)."""

    def __init__(self, run_dir: Path, keep_checkpoints: int, device: torch.device, *, background: bool = True,
                 stop_window: StopWindow | None = None) -> None:
        self.run_dir, self.keep_checkpoints, self.background = run_dir, keep_checkpoints, background
        self.stop_window = stop_window
        """The graceful stop's deadline that the first write is compared with; None: no deadline is known."""
        self._cuda = device.type == "cuda"
        self._files = BackgroundWrite(self._cuda, "distqa-checkpoint-writer")
        self._writes = [self._files]
        """Every background write of this writer, the one the others wait for last."""
        self._writing: list[Path] = []
        self._timed = False

    def step_path(self, step: int) -> Path:
        """Where the step checkpoint of ``step`` is written."""
        return checkpoint_path(self.run_dir, step)

    def submit(self, files: Mapping[Path, ModelCheckpoint]) -> None:
        """Write ``files`` (path: checkpoint) as they are now. Returns once their state is copied to host
        memory and the write has started, after the previous write is complete; raises the previous write's
        error. Step checkpoints (:class:`TrainingCheckpoint`) older than the newest ``keep_checkpoints`` are
        pruned after the write."""
        if self._files.in_flight():
            started, writing = time.perf_counter(), ", ".join(path.name for path in self._writing)
            self._files.wait()
            log.info("waited %.1f s for the write of %s before saving %s: at most one checkpoint write is in "
                     "flight, and that one took longer than the steps since it began", time.perf_counter() - started,
                     writing, ", ".join(path.name for path in files))
        self.wait()
        states = [checkpoint.to_state() for checkpoint in files.values()]
        paths = list(files)
        prune = any(isinstance(checkpoint, TrainingCheckpoint) for checkpoint in files.values())
        if not self.background:
            self._write(states, paths, prune)
            return
        self._writing = paths
        self._files.start(states, lambda snapshot: self._write(snapshot, paths, prune))

    def wait(self) -> None:
        """Return once every write in flight is complete and durable (the last-made first); raise their errors."""
        try:
            for write in reversed(self._writes[1:]):
                write.wait()
        finally:
            self._writes[0].wait()

    @contextlib.contextmanager
    def finishing(self) -> Iterator[CheckpointWriter]:
        """For the training loop: whichever way it ends, a write in flight is completed before the block is
        left (its error raised, or, when the block already fails, logged) and the host copy is freed."""
        try:
            yield self
            self.wait()
        except BaseException:
            try:
                self.wait()
            except Exception as err:  # the block's own error is the one to report; this one goes to the log
                log.error("the checkpoint write in flight failed as well: %s", err)
            raise
        finally:
            for write in self._writes:
                write.close()

    def _write(self, states: list[dict[str, Any]], paths: list[Path], prune: bool) -> None:
        for state, path in zip(states, paths, strict=True):
            started = time.perf_counter()
            if not save_checkpoint(state, path):  # a survivor of a lost peer writes it (distqa.training.peer_loss)
                log.info("left %s to the rank that claimed it", path)
                continue
            seconds, size = time.perf_counter() - started, path.stat().st_size
            log.info("saved checkpoint %s (%.1f MB, %.2f s%s)", path, size / 1e6, seconds,
                     ", in the background" if self.background else "")
            if "optimizer" in state and not self._timed:
                self._timed = True
                self._check_deadline(path, size, seconds)
        if prune:
            prune_checkpoints(self.run_dir, self.keep_checkpoints)

    def _check_deadline(self, path: Path, size: int, seconds: float) -> None:
        """Once, after the first step checkpoint: could a graceful stop write one within its window?"""
        writes = 2 if self.background else 1
        needed = writes * seconds
        measured = (f"{path.name} is {size / 1e6:.1f} MB, written in {seconds:.1f} s "
                    f"({size / 1e6 / max(seconds, 1e-6):.0f} MB/s to {path.parent})")
        window = self.stop_window
        if window is None or needed <= window.seconds:
            log.info("checkpoint write: %s%s", measured, "" if window is None else
                     f"; a graceful stop needs up to {needed:.1f} s of writing, within {window.what}")
            return
        log.warning(
            "a graceful stop may not save its checkpoint in time: %s; a stop writes a checkpoint of the step it "
            "reached%s, up to %.0f s, more than %s. A stop that runs out of time is SIGKILLed mid-write, and the run "
            "resumes from the checkpoint before, losing up to checkpoint_every steps. Fix: a faster volume for "
            "output_dir, %s (over %.0f s), or fewer checkpoints (a larger checkpoint_every, so that a write is less "
            "often in flight when the stop comes)", measured,
            ", after the write in flight if any" if writes == 2 else "", needed, window.what, window.fix, needed)
