"""A stand-in for slow storage (a network volume) under the checkpoint files, for bench/checkpoint_io.py and the tests.

Every byte of a checkpoint still goes through :func:`distqa.files.atomic_write` (temporary name, CRC-32,
fsync, rename, the folder fsynced) into the real file; the stand-in only holds each ``write`` call for as long
as that many bytes take at the given bandwidth, as a volume that accepts ``MB_PER_S`` would, and so in the
thread that writes. It sits where ``distqa.checkpoint.save_checkpoint`` finds ``atomic_write``, so a
checkpoint's sidecar (a few dozen bytes) is throttled alike and other files (config.json, logs) are not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import distqa.checkpoint
from distqa.files import Digest, atomic_write


class ThrottledFile:
    """A write-only binary file that passes every write on after ``len(data) / bytes_per_s`` seconds."""

    def __init__(self, file: IO[bytes], bytes_per_s: float, on_write: Callable[[], None] | None = None) -> None:
        self.file, self.bytes_per_s, self.on_write = file, bytes_per_s, on_write

    def write(self, data: bytes) -> int:
        if self.on_write is not None:
            self.on_write()
        time.sleep(len(data) / self.bytes_per_s)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def throttled_atomic_write(mb_per_s: float, on_write: Callable[[], None] | None = None,
                           ) -> Callable[[Path, Callable[[IO[bytes]], object]], Digest]:
    """:func:`distqa.files.atomic_write` whose writer sees a :class:`ThrottledFile` at ``mb_per_s`` MB/s;
    ``on_write`` runs before each write call (a test's hook: the moment a write is in progress)."""

    def write_slowly(path: Path, write: Callable[[IO[bytes]], object]) -> Digest:
        return atomic_write(path, lambda f: write(ThrottledFile(f, mb_per_s * 1e6, on_write)))  # type: ignore[arg-type]

    return write_slowly


@contextlib.contextmanager
def slow_checkpoint_storage(mb_per_s: float, on_write: Callable[[], None] | None = None) -> Iterator[None]:
    """Checkpoint files written at ``mb_per_s`` MB/s inside the block."""
    real = distqa.checkpoint.atomic_write
    distqa.checkpoint.atomic_write = throttled_atomic_write(mb_per_s, on_write)
    try:
        yield
    finally:
        distqa.checkpoint.atomic_write = real
