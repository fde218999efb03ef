"""Writing files so that readers never see a partial one; imports no torch. The errors a write raises
(:class:`~distqa.config.errors.DiskFullError`) live in :mod:`distqa.config.errors` with the other refusals."""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import socket
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from distqa.config.errors import DiskFullError

OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)
WRITE_BUFFER_BYTES = 1 << 20


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
        fsync_folder(path.parent)
        return Digest(writer.size, writer.crc32)
    except OSError as err:
        if err.errno not in OUT_OF_SPACE:
            raise
        raise DiskFullError(err.errno, f"no space left in {path.parent} ({free_space(path.parent)} free) while "
                            f"writing {path.name}; what was there before is intact. Free space there or "
                            "write elsewhere") from err
    finally:
        tmp.unlink(missing_ok=True)


def fsync_folder(folder: Path) -> None:
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


def manifest_problem(directory: Path, manifest: str) -> str | None:
    """What differs between the files of ``directory`` and what its JSON ``manifest`` (``{"files": {name: {"size",
    "crc32"}}}``) says was written, in one sentence naming the file; None when nothing does. Every size is compared
    before any file is read (a truncated file is found without reading the others), then each CRC-32."""
    try:
        expected = {name: Digest(**digest) for name, digest in
                    json.loads((directory / manifest).read_text())["files"].items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        return f"{directory / manifest} is missing or unreadable ({err}); cannot verify {directory}."
    try:
        for name, digest in expected.items():
            if (size := (directory / name).stat().st_size) != digest.size:
                return f"{directory / name} is truncated or damaged: {size} bytes, {digest.size} were written."
        for name, digest in expected.items():
            if (crc32 := file_digest(directory / name).crc32) != digest.crc32:
                return f"{directory / name} is corrupted: CRC-32 {crc32:08x}, {digest.crc32:08x} was written."
    except OSError as err:
        return f"{directory / name} cannot be read ({err})."
    return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented, key-sorted JSON, written atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """Whether this process may write ``path``: it creates ``.<name>.claim`` beside it exclusively (O_EXCL, which
    shared storage honours too) and removes it when the block ends; False while another writer holds it. A claim
    whose writer was killed stays until the next start removes it
    (distqa.checkpoint.run_folder.remove_stale_temporaries)."""
    claim = path.with_name(f".{path.name}.claim")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        yield False
        return
    try:
        os.write(descriptor, f"{socket.gethostname()} pid {os.getpid()}\n".encode())
        os.close(descriptor)
        yield True
    finally:
        claim.unlink(missing_ok=True)
