"""Featurising in parallel, for any task's feature cache: the worker pool, running tasks on it with progress,
and joining the part files the tasks wrote, in input order.

A task's cache (:mod:`distqa.qa.nq.cache`, :mod:`distqa.qa.squad.cache`) brings what one worker process runs: the
initializer that loads its featuriser and the function that featurises one run of input. At most two runs per
process are in flight, so memory stays flat whatever the input's size. Worker processes import this module: it
stays free of torch and transformers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, fields
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np
import pyarrow as pa
from tqdm import tqdm  # not tqdm.auto: a notebook needs no widget for a cache build

from distqa.qa.feature_store import ArrowStreams, read_table

log = logging.getLogger(__name__)

PROGRESS_LOG_SECONDS = 60
AUTO_BYTES_PER_PROCESS = 16 * 2**20
"""With ``num_proc`` 0, one featurising process per this much input, at most one per core: a process
takes about a second to start, which featurising a few MB never wins back."""


@dataclass
class SplitStats:
    """A task's counts over the examples of one split (a dataclass of ints and dicts of ints), added up with
    ``+=``: every field, a dict's key by key."""

    def __iadd__(self, other: Self) -> Self:
        for name in (field.name for field in fields(self)):
            mine, theirs = getattr(self, name), getattr(other, name)
            if isinstance(mine, dict):
                for key, count in theirs.items():
                    mine[key] = mine.get(key, 0) + count
            else:
                setattr(self, name, mine + theirs)
        return self


Work = TypeVar("Work")
Stats = TypeVar("Stats", bound=SplitStats)


def auto_num_proc(source_bytes: int) -> int:
    """The featurising processes for ``source_bytes`` of input when ``num_proc`` is 0 (auto)."""
    return max(1, min(os.cpu_count() or 1, -(-source_bytes // AUTO_BYTES_PER_PROCESS)))


@contextlib.contextmanager
def featurising_pool(request: Any, num_proc: int, initializer: Callable[[Any, bool], None]
                     ) -> Iterator[ProcessPoolExecutor | None]:
    """``num_proc`` started worker processes, or None (featurise in this process) for one. Each (or this process)
    is set up by ``initializer(request, parallel_tokenizer)``, a module-level function of the task's cache that
    loads its featuriser for ``request``."""
    if num_proc <= 1:
        initializer(request, True)
        yield None
        return
    # spawn: a fresh interpreter per worker, with no inherited tokenizer thread pool or locks.
    with ProcessPoolExecutor(num_proc, mp_context=get_context("spawn"), initializer=initializer,
                             initargs=(request, False)) as pool:
        for _ in range(num_proc):  # start them now (they start lazily, on demand, otherwise)
            pool.submit(os.getpid)
        yield pool


def run_tasks(tasks: list[Work], pool: ProcessPoolExecutor | None,
              featurize: Callable[[Work], tuple[int, dict[str, Stats]]], stats: dict[str, Stats], num_proc: int,
              progress: bool, total: int) -> dict[str, Stats]:
    """Run ``featurize`` (a module-level function: it is sent to the workers) on every task, in ``pool`` or in this
    process, adding each result's per-split counts into ``stats``; it returns how many of the ``total`` examples
    the task held. A progress bar on a terminal; without one (a platform job's log), a log line now and then."""
    bar = tqdm(total=total, unit="example", desc="featurising", disable=None if progress else True)
    started = last_report = time.monotonic()
    finished = 0

    def collect(result: tuple[int, dict[str, Stats]]) -> None:
        nonlocal last_report, finished
        done, task_stats = result
        for split, split_stats in task_stats.items():
            stats[split] += split_stats
        finished += done
        bar.update(done)
        if bar.disable and time.monotonic() - last_report >= PROGRESS_LOG_SECONDS:
            last_report = time.monotonic()
            rate = finished / (last_report - started)
            log.info("featurised %d of %d examples (%.0f/s, about %.0f min left)", finished, total, rate,
                     (total - finished) / max(rate, 1e-9) / 60)

    with bar:
        if pool is None:
            for task in tasks:
                collect(featurize(task))
            return stats
        pending: set[Future] = set()
        for task in tasks:  # at most two tasks per process in flight: memory stays flat
            pending.add(pool.submit(featurize, task))
            if len(pending) >= 2 * num_proc:
                done_now, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done_now:
                    collect(future.result())
        for future in pending:
            collect(future.result())
    return stats


# --- part files --------------------------------------------------------------------------------

def part_file(parts: Path, split: str, name: str, task: int) -> Path:
    """Where task ``task`` writes its ``name`` rows (``windows``, ``examples``) of ``split``."""
    return parts / f"{split}-{name}-{task:06d}.arrow"


def join_parts(building: Path, split: str, num_tasks: int) -> None:
    """Concatenate a split's part files in task order; window rows get global example indices."""
    (building / split).mkdir()
    examples_so_far = 0
    with ArrowStreams({name: building / split / f"{name}.arrow" for name in ("windows", "examples")}) as files:
        for task in range(num_tasks):
            windows = read_table(part_file(building / "parts", split, "windows", task))
            examples = read_table(part_file(building / "parts", split, "examples", task))
            index = windows.column("example_index").to_numpy() + examples_so_far
            windows = windows.set_column(windows.schema.get_field_index("example_index"), "example_index",
                                         pa.array(index.astype(np.int32)))
            examples_so_far += examples.num_rows
            files.write("windows", windows)
            files.write("examples", examples)
