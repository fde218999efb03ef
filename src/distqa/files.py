"""Writing files so that readers never see a partial one; imports no torch."""

from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import shutil
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
WRITE_BUFFER_BYTES = 1 << 20
WORKER_REPORT_DIR_VARIABLE = "WORKER_STOP_REPORT_DIR"
"""The node-local folder scripts/worker.sh gives its workers for a one-line report of why they ended (torchrun
itself exits with 1 whatever their codes were): distqa.stop's ``rank-<R>`` after a graceful stop, and
``exit-<CODE>-rank-<R>`` from :func:`report_failure`."""



class DataError(ValueError):
    """An input file cannot be used; the message names the file, line and field, and the fix. Entry points
    print it in one line (exit 2); a task raises it for data it cannot read."""


class BadRecordError(DataError):
    """A malformed line or record read with ``on_bad_line='fail'``; the message says what is wrong and to fix or remove
    it. Only the commands that have ``--on-bad-line`` (prepare, train) add :data:`SKIP_ADVICE` where they print it:
    predict and score read every record, so they have no way to skip one to advise."""


SKIP_ADVICE = "Or pass --on-bad-line skip to skip and count bad records."

class DiskFullError(OSError):
    """A write failed for lack of space (or quota); the message names the folder and its free space."""


@dataclass(frozen=True)
class Digest:
    """Size and CRC-32 of a file's bytes, as written."""

    size: int
    crc32: int


class _DigestingWriter:
    """A binary file that keeps the size and CRC-32 of what passes through ``write``: the checksum
    costs no second pass over a multi-GB file. Writers that only ever append (``torch.save`` to a
    file object streams its zip archive) are the only callers."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file, self.size, self.crc32 = file, 0, 0

    def write(self, data: bytes) -> int:
        written = self.file.write(data)
        self.crc32 = zlib.crc32(data, self.crc32)
        self.size += len(data)
        return written

    def flush(self) -> None:
        self.file.flush()


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> Digest:
    """Write through ``write(file)`` to a temporary sibling, fsync, then rename over ``path`` and fsync the
    folder: readers see the old file or the complete new one, never a partial one (a kill mid-write
    included), and once this returns the new one survives a crash of the machine too.
    Returns the size and CRC-32 of the bytes written. A full disk raises :class:`DiskFullError`
    naming the folder and its free space; the file that was there before is left untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # A 1 MiB buffer gathers torch.save's hundreds of small writes into a few system calls: fewer round
        # trips to a network volume, and fewer GIL hand-overs when a background thread writes.
        with open(tmp, "wb", buffering=WRITE_BUFFER_BYTES) as f:
            writer = _DigestingWriter(f)
            write(writer)  # type: ignore[arg-type]  # a write-only stand-in for the file
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_folder(path.parent)
        return Digest(writer.size, writer.crc32)
    except OSError as err:
        if err.errno not in OUT_OF_SPACE:
            raise
        raise DiskFullError(err.errno, f"no space left in {path.parent} ({free_space(path.parent)} free) while "
                            f"writing {path.name}; what was there before is intact. Free space there or "
                            "write elsewhere") from err
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (the rename is an entry of the folder, not of the file)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def free_space(folder: Path) -> str:
    """Free space of the file system holding ``folder``, for messages ("1.2 GB")."""
    try:
        return f"{shutil.disk_usage(folder).free / 1e9:.1f} GB"
    except OSError:
        return "unknown space"


def file_digest(path: Path, chunk_bytes: int = 16 << 20) -> Digest:
    """Size and CRC-32 of a file, read in chunks (about 2.5 GB/s of CRC on one core)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return Digest(size, crc)


def read_with_digest(path: Path, chunk_bytes: int = 16 << 20) -> tuple[mmap.mmap, Digest]:
    """The whole file in anonymous memory (one open, one pass), with the size and CRC-32 of its bytes.
    The memory is file-like (``read``/``seek``: ``torch.load`` reads it) and a writable buffer; close it
    when done. A file that changes size while it is read raises OSError."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        memory = mmap.mmap(-1, max(size, 1))  # an anonymous map cannot be empty
        view, crc, done = memoryview(memory), 0, 0
        try:
            while done < size and (count := f.readinto(view[done:min(done + chunk_bytes, size)])):
                crc = zlib.crc32(view[done:done + count], crc)
                done += count
        finally:
            view.release()
    if done != size:
        memory.close()
        raise OSError(errno.EIO, f"{path} changed size while it was read ({done} of {size} bytes)")
    return memory, Digest(size, crc)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented, key-sorted JSON, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


def print_error(line: str) -> None:
    """``line`` and its newline on stderr in one write: the ranks of a job share their agent's pipe, and with
    ``PYTHONUNBUFFERED`` print() writes the text and the newline apart, so two ranks' lines could run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def report_failure(message: str, exit_code: int) -> int:
    """An entry point's refusal, said once everywhere it is looked for: ``message`` on stderr
    (:func:`print_error`), in this process's log files (``logs/rank-<R>.log`` once the run directory exists),
    and, under ``scripts/worker.sh``, in ``$WORKER_STOP_REPORT_DIR/exit-<CODE>-rank-<R>``: worker.sh then exits
    with ``exit_code`` instead of torchrun's 1, and distqa.agent leaves out torchrun's ChildFailedError
    traceback. Returns ``exit_code``."""
    print_error(message)
    record = logging.LogRecord("distqa", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):  # stderr has it already
            handler.handle(record)
    folder = os.environ.get(WORKER_REPORT_DIR_VARIABLE)
    if folder and Path(folder).is_dir():
        rank = os.environ.get("RANK", "0")
        (Path(folder) / f"exit-{exit_code}-rank-{rank}").write_text(message + "\n")
    return exit_code
