"""Writing files so that readers never see a partial one; imports no torch."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write through ``write(file)`` to a temporary sibling, fsync, then rename over ``path``: readers
    see the old file or the complete new one, never a partial one (a kill mid-write included)."""
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented, key-sorted JSON, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
