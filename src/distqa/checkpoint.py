"""Checkpoints: atomic save, find the newest, load, prune.

A checkpoint is one ``torch.save`` file ``<run dir>/checkpoints/step-00000100.pt`` holding plain
tensors and Python containers, so it loads with ``weights_only=True`` (no pickled code runs).
It is written to a temporary name, flushed to disk and renamed: a job killed mid-write leaves the
previous checkpoint intact and never a truncated file under a real name. Step checkpoints hold the
whole training state; ``best.pt`` only the model with the best validation micro-F1 so far, its
config and its decoding thresholds (what ``predict`` needs).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}.pt"


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write through ``write(file)`` to a temporary sibling, fsync, then rename over ``path``: readers
    see the old file or the complete new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda f: torch.save(state, f))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints of a run, oldest first (temporary files are ignored)."""
    folder = checkpoint_dir(run_dir)
    found = [(int(m.group(1)), p) for p in folder.glob("step-*.pt") if (m := CHECKPOINT_NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(run_dir)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete temporaries of writes that a kill interrupted (SIGTERM/SIGKILL end a worker at once,
    mid-write included). Only call while no checkpoint is being written: at start-up, on rank 0."""
    stale = list(checkpoint_dir(run_dir).glob(".step-*.tmp"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


TRAINING_STATE = ("model", "optimizer", "scheduler", "progress", "config")
"""What resuming needs; ``best.pt`` and inference need only the model and its config."""
MODEL_STATE = ("model", "config")


def best_checkpoint_path(run_dir: Path) -> Path:
    """The model with the best validation micro-F1 so far, with its decoding thresholds."""
    return checkpoint_dir(run_dir) / "best.pt"


def load_checkpoint(path: Path, required: tuple[str, ...] = TRAINING_STATE) -> dict[str, Any]:
    """Load on the CPU; raises ValueError naming the file when it is not a checkpoint of this recipe."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); "
                         "pass another file or --resume none.") from err
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a checkpoint of distqa.train.")
    missing = set(required) - set(state)
    if missing:
        written_by = ("it holds no training state (best.pt does not: resume from a step-*.pt)"
                      if set(MODEL_STATE) <= set(state) else "it was not written by distqa.train")
        raise ValueError(f"{path} is missing {sorted(missing)}; {written_by}.")
    return state
