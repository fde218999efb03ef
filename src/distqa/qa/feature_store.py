"""What every feature cache shares (NQ's and SQuAD's): the input digest of its fingerprint, its atomic
publication, its manifest, and reading its windows back memory-mapped.

A cache is one directory per fingerprint, ``<cache_dir>/<input stem>-<fingerprint>/``, with a ``manifest.json``
written last and one folder per split of Arrow IPC streams (``windows.arrow``, ``examples.arrow``). It is built
under a temporary name and renamed when complete (:func:`building_directory`), so an interrupted build leaves
nothing that looks complete. No torch here: featurising worker processes import this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from distqa.config.errors import DataError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SAMPLE_BLOCKS, SAMPLE_BLOCK_BYTES = 16, 1 << 16
BEFORE_LAUNCH = (", before launching a multi-process run, on storage every node mounts (the launcher scripts do "
                 "this for you)")
"""How a run that finds no cache ends its message: with several ranks, the cache must exist before launch."""


def cached(request: Any, cache_dir: Path) -> Path | None:
    """The complete cache of ``request`` (a task's, with ``directory(cache_dir)``) in ``cache_dir``, or None."""
    directory = request.directory(cache_dir)
    return directory if (directory / MANIFEST).is_file() else None


def find_cache(request: Any, cache_dir: Path, what: str, command: str, hint: str = "") -> Path:
    """The complete cache of ``request`` in ``cache_dir``; a :class:`DataError` naming ``what`` (the cache and its
    source) and ``command``, which builds it, when there is none (``hint`` ends the message)."""
    directory = cached(request, cache_dir)
    if directory is None:
        raise DataError(f"no {what} with these settings in {cache_dir}. Build it with `{command}` and the same "
                        f"preset, .env and flags as this run{hint}.")
    return directory


def hash_source(digest: Any, path: Path, whole_below: int = 0) -> None:
    """Feed ``digest`` (a ``hashlib`` object) with the size of the file at ``path`` and its content: all of it
    when it is smaller than ``whole_below`` bytes, else 16 sampled blocks (a full read of a 16 GB NQ file would
    cost minutes at every start). Neither its path nor its mtime counts: both change when it is copied."""
    size = path.stat().st_size
    digest.update(str(size).encode())
    with path.open("rb") as file:
        if size < whole_below:
            digest.update(file.read())
            return
        for block in range(SAMPLE_BLOCKS):
            file.seek(size * block // SAMPLE_BLOCKS)
            digest.update(file.read(SAMPLE_BLOCK_BYTES))


@contextlib.contextmanager
def building_directory(final: Path) -> Iterator[Path]:
    """An empty temporary sibling of ``final`` to build a cache in, renamed to ``final`` when the block ends
    without an error (write the manifest last): readers never see a partial cache, and an interrupted build
    leaves nothing that looks complete. Partial builds of killed processes of this host are removed first."""
    _remove_abandoned_builds(final)
    building = final.with_name(f"{final.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        yield building
        try:
            building.rename(final)
        except OSError:
            if not (final / MANIFEST).is_file():  # another process finished the same cache first: fine
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _remove_abandoned_builds(final: Path) -> None:
    """Delete partial builds of this cache left by killed processes of this host (they can be GBs)."""
    host = socket.gethostname()
    for partial in final.parent.glob(f"{final.name}.tmp-{host}-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            log.info("removing %s, left by an interrupted build", partial)
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def load_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / MANIFEST).read_text())


def read_table(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all()


def list_rows(column: pa.ChunkedArray) -> list[np.ndarray]:
    """Each row of an Arrow list column as a numpy array (one conversion per chunk, not per value)."""
    rows: list[np.ndarray] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy()
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        rows.extend(np.split(values, offsets[1:-1] - offsets[0]))
    return rows


class ArrowStreams:
    """Arrow IPC stream files written table by table, one per name (``windows``, ``examples``) at ``paths``: a file
    is created with the schema of its first table. A context manager; leaving it closes the files."""

    def __init__(self, paths: Mapping[str, Path]) -> None:
        self.paths = dict(paths)
        self.sinks: dict[str, Any] = {}
        self.writers: dict[str, Any] = {}

    def __enter__(self) -> ArrowStreams:
        return self

    def write(self, name: str, table: pa.Table) -> None:
        if name not in self.writers:
            self.sinks[name] = pa.OSFile(str(self.paths[name]), "wb")
            self.writers[name] = pa.ipc.new_stream(self.sinks[name], table.schema)
        self.writers[name].write_table(table)

    def __exit__(self, *exc: object) -> None:
        for name, writer in self.writers.items():
            writer.close()
            self.sinks[name].close()


# --- reading ---------------------------------------------------------------------------------------------

class StoredWindows:
    """The windows of one split of a feature cache (``<split>/windows.arrow``), as a map-style dataset. The token ids
    stay memory-mapped, one zero-copy (rows, max_seq_len) view per record batch: opening a cache of any size takes
    milliseconds and no RAM. The per-window ``SCALARS`` are loaded as int64 arrays in ``columns``. A subclass gives
    the token types and sets ``document_begin``/``document_end``, the window positions where answers may lie (what
    :func:`distqa.qa.inference.score_windows` reads)."""

    SCALARS: tuple[str, ...] = ()
    KIND = ""
    """The task's data, in the message for a missing file."""

    def __init__(self, directory: Path, split: str) -> None:
        path = Path(directory) / split / "windows.arrow"
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; is {directory} a complete {self.KIND} feature cache?")
        self.table = read_table(path)
        self.num_rows = self.table.num_rows
        column = self.table.column("input_ids")
        self.max_seq_len = column.type.list_size
        self.input_ids = [chunk.values.to_numpy(zero_copy_only=True).reshape(-1, self.max_seq_len)
                          for chunk in column.chunks if len(chunk)]
        self.chunk_starts = np.cumsum([0] + [len(ids) for ids in self.input_ids])[:-1]
        """Where each record batch starts."""
        self.columns = {name: self.table.column(name).to_numpy().astype(np.int64) for name in self.SCALARS}
        self.positions = np.arange(self.max_seq_len)
        self.document_begin: np.ndarray
        """Window position of each window's first document (context) token."""
        self.document_end: np.ndarray
        """Window position after each window's last document (context) token."""

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Window ``index`` as the model's inputs and labels, dicts of numpy arrays (the DataLoader's collate makes
        tensors); ``attention_mask`` and ``token_type_ids`` rebuilt from the stored lengths (an IndexError past the
        end)."""
        if not 0 <= index < self.num_rows:
            raise IndexError(f"window {index} out of range for {self.num_rows} windows")
        chunk = int(np.searchsorted(self.chunk_starts, index, side="right")) - 1
        attention_mask = (self.positions < self.columns["length"][index]).astype(np.int64)
        return {
            "input_ids": self.input_ids[chunk][index - self.chunk_starts[chunk]].astype(np.int64),
            "attention_mask": attention_mask,
            "token_type_ids": self.token_type_ids(index, attention_mask),
            "start_positions": self.columns["start_position"][index],
            "end_positions": self.columns["end_position"][index],
            "answer_type": self.columns["answer_type"][index],
        }

    def token_type_ids(self, index: int, attention_mask: np.ndarray) -> np.ndarray:
        """Window ``index``'s token types, by the task's template."""
        raise NotImplementedError
