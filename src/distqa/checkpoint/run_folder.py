"""A run's checkpoints folder, ``<run dir>/checkpoints/``: the names of step checkpoints, listing them in step order
(files and sharded directories together), the newest intact one (what auto-resume takes), pruning and the clean-up
of temporaries a kill left behind. What one checkpoint holds and how it is written and read is
:mod:`distqa.checkpoint.format`.
"""

from __future__ import annotations

import logging
import mmap
import re
import shutil
from pathlib import Path
from typing import Generic, NamedTuple

from distqa.checkpoint.format import (
    C,
    CheckpointError,
    TrainingCheckpoint,
    digest_path,
    parse_checkpoint,
    read_checkpoint,
    read_sharded,
)

log = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.(?:pt|dcp)$")
"""A step checkpoint: a file, or a directory of DCP shards (:mod:`distqa.checkpoint.sharded`)."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.pt"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints of a run, files and sharded directories together, oldest first (temporaries are ignored)."""
    folder = checkpoint_dir(run_dir)
    found = [(int(m.group(1)), p) for p in folder.glob("step-*") if (m := CHECKPOINT_NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
            continue
        old.unlink(missing_ok=True)
        digest_path(old).unlink(missing_ok=True)


class IntactCheckpoint(NamedTuple, Generic[C]):
    path: Path
    checkpoint: C
    data: mmap.mmap | None
    """The file's bytes as read (once) for ``checkpoint``: resume hands them on to the other ranks of the node;
    None for a sharded directory (every rank reads its shards)."""


def newest_intact_checkpoint(run_dir: Path, kind: type[C] = TrainingCheckpoint) -> IntactCheckpoint[C] | None:  # type: ignore[assignment]
    """The newest step checkpoint that verifies and loads, with its contents; None if there is none.

    Each damaged newer one is reported in one line and renamed ``<name>.corrupt`` (kept for a look,
    never chosen or counted by pruning again). A sharded directory is verified against its manifest (every
    file's size, then CRC-32) and read without its weights. Rank 0 only: it renames files."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            if path.is_dir():
                return IntactCheckpoint(path, read_sharded(path, kind), None)
            data = read_checkpoint(path)
            return IntactCheckpoint(path, parse_checkpoint(data, path, kind), data)
        except CheckpointError as err:
            quarantined = path.with_name(path.name + ".corrupt")
            path.replace(quarantined)
            digest_path(path).unlink(missing_ok=True)
            log.error("skipping a damaged checkpoint: %s Renamed it %s; resuming from the one before.",
                      err, quarantined.name)
    return None


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete temporaries of writes that a kill interrupted (SIGTERM/SIGKILL end a worker at once,
    mid-write included). Only call while no checkpoint is being written: at start-up, on rank 0."""
    # and the claims of survivors' saves after a lost peer (distqa.training.peer_loss) that another failure cut short
    stale = [*checkpoint_dir(run_dir).glob(".step-*.tmp"), *checkpoint_dir(run_dir).glob(".step-*.claim")]
    for path in stale:
        if path.is_dir():  # a sharded checkpoint's directory, renamed into place only once complete
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def best_checkpoint_path(run_dir: Path) -> Path:
    """The model with the best validation metric so far, with its task's inference state."""
    return checkpoint_dir(run_dir) / "best.pt"

