"""A stand-in for slow storage (a network volume) under the checkpoint files, for bench/checkpoint_io.py and the tests.

Every byte of a checkpoint still goes through :func:`distqa.checkpoint.files.atomic_write` (temporary name, CRC-32,
fsync, rename, the folder fsynced) into the real file; the stand-in only holds the writing thread for as long as
the bytes take at the given bandwidth: once per MB written, and for the rest at the end, as a buffered file on a
network volume blocks when it sends a block (``torch.save`` makes hundreds of small writes per checkpoint, which
a file's buffer gathers; a pause for each would hand the GIL back and forth hundreds of times, which no real
volume does). It sits where ``distqa.checkpoint.format.save_checkpoint`` finds ``atomic_write``, so a
checkpoint's sidecar (a few dozen bytes) is throttled alike and other files (config.json, logs) are not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import distqa.checkpoint.format
from distqa.checkpoint.files import Digest, atomic_write

BLOCK_BYTES = 1 << 20


class ThrottledFile:
    """A write-only binary file that takes ``bytes / bytes_per_s`` seconds for the bytes passed on: a pause per
    MB, and :meth:`settle` for the rest."""

    def __init__(self, file: IO[bytes], bytes_per_s: float, on_write: Callable[[], None] | None = None) -> None:
        self.file, self.bytes_per_s, self.on_write = file, bytes_per_s, on_write
        self.unpaid = 0
        """Bytes passed on whose time has not been taken yet."""

    def write(self, data: bytes) -> int:
        if self.on_write is not None:
            self.on_write()
        self.unpaid += len(data)
        if self.unpaid >= BLOCK_BYTES:
            self.settle()
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def settle(self) -> None:
        time.sleep(self.unpaid / self.bytes_per_s)
        self.unpaid = 0


def throttled_atomic_write(mb_per_s: float, on_write: Callable[[], None] | None = None,
                           ) -> Callable[[Path, Callable[[IO[bytes]], object]], Digest]:
    """:func:`distqa.checkpoint.files.atomic_write` whose writer sees a :class:`ThrottledFile` at ``mb_per_s`` MB/s;
    ``on_write`` runs before each write call (a test's hook: the moment a write is in progress)."""

    def write_slowly(path: Path, write: Callable[[IO[bytes]], object]) -> Digest:
        def throttled(f: IO[bytes]) -> None:
            slow = ThrottledFile(f, mb_per_s * 1e6, on_write)
            write(slow)  # type: ignore[arg-type]  # a write-only stand-in for the file
            slow.settle()

        return atomic_write(path, throttled)

    return write_slowly


@contextlib.contextmanager
def slow_checkpoint_storage(mb_per_s: float, on_write: Callable[[], None] | None = None) -> Iterator[None]:
    """Checkpoint files written at ``mb_per_s`` MB/s inside the block."""
    real = distqa.checkpoint.format.atomic_write
    distqa.checkpoint.format.atomic_write = throttled_atomic_write(mb_per_s, on_write)
    try:
        yield
    finally:
        distqa.checkpoint.format.atomic_write = real
