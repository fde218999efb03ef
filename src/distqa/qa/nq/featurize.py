"""The NQ side of featurising in parallel (:mod:`distqa.qa.featurize`): the scanned lines cut into runs, what a
worker process does with one (re-read its lines by byte offset, featurise them one tokenizer batch at a time),
and the part files it writes them to.

:func:`distqa.qa.nq.cache.build_cache` drives it; worker processes import this module: it stays free of torch and
transformers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from distqa.qa.feature_store import ArrowStreams
from distqa.qa.featurize import part_file
from distqa.qa.nq.reader import ScanResult, parse_example, read_lines
from distqa.qa.nq.windows import EXAMPLE_COLUMNS, Features, Featurizer, WindowStats

if TYPE_CHECKING:
    from distqa.qa.nq.cache import CacheRequest

MAX_TASK_BYTES = 64 << 20
BATCH_BYTES = 2 << 20
"""Input bytes per tokenizer call: bounds the memory of a featurising process (the fast tokenizer
keeps ~100 bytes per wordpiece until the batch is done)."""


@dataclass(frozen=True)
class LineRun:
    """Consecutive scanned lines that one worker featurises into its own part files (numbered ``index``)."""

    index: int
    source: Path
    lines: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    splits: np.ndarray
    split_names: tuple[str, ...]
    labelled: bool
    parts: Path


def make_runs(request: CacheRequest, scanned: ScanResult, splits: np.ndarray, parts: Path,
              num_proc: int) -> Iterator[LineRun]:
    """Runs of consecutive lines, about four per process (load balance) and at most
    MAX_TASK_BYTES each (so a lost task costs little and the part files stay small)."""
    target = min(MAX_TASK_BYTES, max(1, int(scanned.lengths.sum()) // (4 * num_proc)))
    ends = np.cumsum(scanned.lengths)
    start, index = 0, 0
    while start < len(scanned):
        # The first line past `target` bytes from here ends the task (so every task holds >= 1 line).
        stop = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + target, side="left")) + 1
        part = slice(start, min(stop, len(scanned)))
        yield LineRun(index, request.source, scanned.lines[part], scanned.offsets[part], scanned.lengths[part],
                      splits[part], request.splits, request.labelled, parts)
        start, index = part.stop, index + 1


_featurizer: Featurizer | None = None


def init_worker(request: CacheRequest, parallel_tokenizer: bool) -> None:
    global _featurizer
    if not parallel_tokenizer:  # one process per core already; the Rust thread pool would oversubscribe
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _featurizer = Featurizer(Tokenizer.from_str(request.tokenizer_json), request.pad_id, request.settings,
                             request.template)


def featurize_run(task: LineRun) -> tuple[int, dict[str, WindowStats]]:
    """Featurise one run's lines into its part files, one tokenizer batch of at most
    BATCH_BYTES at a time: a worker's memory does not depend on the size of the input."""
    assert _featurizer is not None, "worker not initialised"
    stats = {split: WindowStats() for split in task.split_names}
    with contextlib.ExitStack() as files:
        writers = {split: files.enter_context(_PartWriter(task.parts, split, task.index)) for split in task.split_names}
        for batch in _batches(task.lengths, BATCH_BYTES):
            raw_lines = read_lines(task.source, task.offsets[batch], task.lengths[batch])
            examples = [parse_example(raw, task.labelled) for raw in raw_lines]
            for split_index, split in enumerate(task.split_names):
                members = np.flatnonzero(task.splits[batch] == split_index)
                # Training windows are downsampled; evaluation needs every window of its examples.
                features = _featurizer.featurize([examples[i] for i in members], keep_all=split != "train")
                features.examples["line"] = task.lines[batch][members]
                features.examples["byte_offset"] = task.offsets[batch][members]
                writers[split].add(features)
                stats[split] += features.stats
        for writer in writers.values():
            if not writer.writers:  # no example of this split here: empty parts keep the join simple
                features = _featurizer.featurize([])
                features.examples["line"] = features.examples["byte_offset"] = np.empty(0, dtype=np.int64)
                writer.add(features)
    return len(task.lines), stats


def _batches(lengths: np.ndarray, max_bytes: int) -> Iterator[slice]:
    start, size = 0, 0
    for index, length in enumerate(lengths.tolist()):
        if size and size + length > max_bytes:
            yield slice(start, index)
            start, size = index, 0
        size += length
    if start < len(lengths):
        yield slice(start, len(lengths))


# --- Arrow part files -------------------------------------------------------------------------

def _window_table(features: Features) -> pa.Table:
    columns = dict(features.windows)
    input_ids = columns.pop("input_ids")
    arrays = {"input_ids": pa.FixedSizeListArray.from_arrays(pa.array(input_ids.reshape(-1)), input_ids.shape[1])}
    arrays |= {name: pa.array(values) for name, values in columns.items()}
    return pa.table(arrays)


_EXAMPLE_TYPES = {
    "example_id": pa.int64(), "question": pa.string(), "answer_type": pa.int8(), "num_tokens": pa.int32(),
    "question_len": pa.int16(), "piece_to_token": pa.list_(pa.int32()), "candidate_start": pa.list_(pa.int32()),
    "candidate_end": pa.list_(pa.int32()), "candidate_top_level": pa.list_(pa.bool_()),
    "long_start": pa.int32(), "long_end": pa.int32(), "long_candidate": pa.int32(),
    "short_start": pa.list_(pa.int32()), "short_end": pa.list_(pa.int32()),
    "line": pa.int64(), "byte_offset": pa.int64(),
}
assert set(_EXAMPLE_TYPES) == {*EXAMPLE_COLUMNS, "line", "byte_offset"}


def _example_table(features: Features) -> pa.Table:
    return pa.table({name: pa.array(features.examples[name], type=kind) for name, kind in _EXAMPLE_TYPES.items()})


class _PartWriter(ArrowStreams):
    """A task's window and example part files of one split, appended to batch by batch."""

    def __init__(self, parts: Path, split: str, task: int) -> None:
        super().__init__({name: part_file(parts, split, name, task) for name in ("windows", "examples")})
        self.example_rows = 0

    def add(self, features: Features) -> None:
        features.windows["example_index"] = features.windows["example_index"] + self.example_rows
        self.example_rows += len(features.examples["example_id"])
        self.write("windows", _window_table(features))
        self.write("examples", _example_table(features))
