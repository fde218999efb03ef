"""The SQuAD feature cache: data in the SQuAD schema featurised once, in parallel, into memory-mapped Arrow files.

Layout (one directory per fingerprint of the input files, the tokenizer and the window settings, as NQ's cache;
the fingerprint, the atomic publication (:mod:`distqa.qa.feature_store`) and the parallel pool
(:mod:`distqa.qa.featurize`) are shared)::

    <squad_cache_dir>/<train file stem>-<fingerprint>/
      manifest.json              sources, settings, counts and the summary of the build
      train/windows.arrow        one row per window: input_ids[max_seq_len], length, context_start, context_end,
      train/examples.arrow       segment_start, example_index, labels, the context tokens' character offsets;
      validation/...             one row per question: id, title, question, context, answer texts and starts
      test/...                   (predict's input, whose answers are not read)

Building: the sources are read and checked (:mod:`distqa.qa.squad.reader`), the validation split is the validation file
or whole contexts held out of the training file, then ``num_proc`` processes cut runs of questions into windows
(:mod:`distqa.qa.squad.windows`) into part files joined in input order, at most two runs per process in flight
(:mod:`distqa.qa.featurize`, as NQ's). ``datasets.Dataset.from_file(".../train/windows.arrow")`` opens a file for
inspection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from distqa.config import ConfigError
from distqa.config.errors import DataError
from distqa.qa.bad_records import BadLinePolicy
from distqa.qa.feature_store import (
    MANIFEST,
    ArrowStreams,
    StoredWindows,
    building_directory,
    hash_source,
    list_rows,
    load_manifest,
    read_table,
)
from distqa.qa.feature_store import cached as cached  # the SQuAD cache's lookup, with its request
from distqa.qa.featurize import featurising_pool, join_parts, part_file, run_tasks
from distqa.qa.squad.reader import SquadExample, SquadRecords, hub_name, read_squad, source_path
from distqa.qa.squad.windows import SquadFeatures, SquadFeaturizer, SquadStats, SquadWindowSettings, answer_span

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the features change meaning, so old caches are not reused."""
WHOLE_FILE_HASH_BYTES = 256 << 20
"""Input files below this size are hashed whole for the fingerprint (a fixed answer_start changes it), bigger
ones by samples, as NQ's."""
QUESTIONS_PER_TASK = 1000


@dataclass(frozen=True)
class SquadCacheRequest:
    """Everything that determines the content of a cache (and hence its fingerprint)."""

    train: str
    """The training source (a path or ``hf:NAME:SPLIT``); predict's input when not ``labelled``."""
    validation: str
    """The validation source; empty: ``validation_fraction`` of the training contexts is held out."""
    validation_fraction: float
    labelled: bool
    settings: SquadWindowSettings
    tokenizer_json: str
    pad_id: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, train: str | Path, settings: SquadWindowSettings, validation: str = "",
                       validation_fraction: float = 0.0, labelled: bool = True) -> SquadCacheRequest:
        """``tokenizer``: a ``transformers`` fast tokenizer, whose pair template the windows follow."""
        if not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token_id is None:
            raise DataError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer with a padding token; SQuAD "
                            "featurisation needs one (a tokenizer.json, as every encoder on the hub has)")
        held_out = validation_fraction if labelled and not validation else 0.0
        return cls(str(train), validation if labelled else "", held_out, labelled, settings,
                   tokenizer.backend_tokenizer.to_str(), tokenizer.pad_token_id)

    def fingerprint(self) -> str:
        """Hash of the sources' content (a hub source: its name), the tokenizer and every window setting."""
        digest = hashlib.sha256(json.dumps({
            "format": FORMAT_VERSION, "labelled": self.labelled, "settings": asdict(self.settings),
            "validation_fraction": self.validation_fraction, "pad_id": self.pad_id,
            "sources": [self.train, self.validation],
        }, sort_keys=True).encode())
        digest.update(hashlib.sha256(self.tokenizer_json.encode()).digest())
        for spec, setting in ((self.train, "squad_train_file"), (self.validation, "squad_validation_file")):
            if spec and not hub_name(spec):
                hash_source(digest, source_path(spec, setting), whole_below=WHOLE_FILE_HASH_BYTES)
        return digest.hexdigest()[:16]

    def directory(self, cache_dir: Path) -> Path:
        hub = hub_name(self.train)
        stem = "-".join(hub).replace("/", "-") if hub else Path(self.train).stem
        return Path(cache_dir) / f"{stem}-{self.fingerprint()}"


def build_squad_cache(request: SquadCacheRequest, cache_dir: Path, num_proc: int = 1,
                      on_bad_line: BadLinePolicy = "skip", max_bad_line_fraction: float = 0.01) -> Path:
    """Featurise the sources of ``request`` into ``cache_dir`` unless an identical cache exists; return its path."""
    final = request.directory(cache_dir)
    if (final / MANIFEST).is_file():
        log.info("reusing the SQuAD feature cache %s\n%s", final, format_summary(load_manifest(final)))
        return final
    started = time.perf_counter()
    checked_featurizer(request)  # the settings checked before any process starts
    # The featurising processes start first: they load while this process reads and checks the sources.
    with featurising_pool(request, num_proc, _init_worker) as pool:
        read = [read_squad(request.train, "train" if request.labelled else "ignore", on_bad_line,
                           max_bad_line_fraction, setting="squad_train_file" if request.labelled else "input")]
        if request.validation:
            read.append(read_squad(request.validation, "train", on_bad_line, max_bad_line_fraction,
                                   setting="squad_validation_file"))
        splits = _splits(request, read)
        read_seconds = time.perf_counter() - started
        with building_directory(final) as building:
            (building / "parts").mkdir()
            stats = {}
            for split, examples in splits.items():
                log.info("featurising %d %s questions with %d process(es)", len(examples), split, num_proc)
                stats[split] = _write_split(building, split, examples, pool, num_proc)
            shutil.rmtree(building / "parts")
            summary = _summary(request, read, stats, read_seconds, time.perf_counter() - started)
            (building / MANIFEST).write_text(json.dumps(summary, indent=2) + "\n")
    log.info("SQuAD feature cache ready: %s\n%s", final, format_summary(summary))
    return final


def _splits(request: SquadCacheRequest, read: list[SquadRecords]) -> dict[str, list[SquadExample]]:
    if not request.labelled:
        return {"test": read[0].examples}
    if request.validation:
        return {"train": read[0].examples, "validation": read[1].examples}
    train, validation = hold_out(read[0].examples, request.validation_fraction)
    return {"train": train, "validation": validation} if validation else {"train": train}


def hold_out(examples: Sequence[SquadExample], fraction: float) -> tuple[list[SquadExample], list[SquadExample]]:
    """(train, validation): whole contexts, in the order of a hash of their text, go to validation until it holds
    ``round(fraction × questions)`` questions; no context is in both, and a question keeps its side when others
    are added or the file is reordered."""
    by_context: dict[str, int] = {}
    for example in examples:
        by_context[example.context] = by_context.get(example.context, 0) + 1
    target, held, count = round(fraction * len(examples)), set(), 0
    for context in sorted(by_context, key=lambda c: hashlib.sha256(c.encode()).digest()):
        if count >= target:
            break
        held.add(context)
        count += by_context[context]
    return [e for e in examples if e.context not in held], [e for e in examples if e.context in held]


# --- featurising processes ----------------------------------------------------------------------------

_featurizer: SquadFeaturizer | None = None


@dataclass(frozen=True)
class QuestionRun:
    """Consecutive questions of one split that a featurising process cuts into windows, written to its own part
    files (numbered ``index``); their windows keep the context tokens' offsets but in training (nothing decodes
    its windows)."""

    index: int
    split: str
    examples: Sequence[SquadExample]
    parts: Path


def checked_featurizer(request: SquadCacheRequest) -> SquadFeaturizer:
    """The featuriser of ``request``; a ConfigError when its tokenizer cannot make windows of its settings."""
    try:
        return SquadFeaturizer(request.tokenizer_json, request.pad_id, request.settings)
    except ValueError as err:
        raise ConfigError(f"{err}.") from None


def _init_worker(request: SquadCacheRequest, parallel_tokenizer: bool) -> None:
    global _featurizer
    if not parallel_tokenizer:  # one process per core already; the Rust thread pool would oversubscribe
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _featurizer = SquadFeaturizer(request.tokenizer_json, request.pad_id, request.settings)


def _featurize_run(run: QuestionRun) -> tuple[int, dict[str, SquadStats]]:
    """Cut one run's questions into windows (labelled by the first answer's characters) in its part files."""
    assert _featurizer is not None, "worker not initialised"
    examples = run.examples
    features = _featurizer.featurize([e.question for e in examples], [e.context for e in examples],
                                     [answer_span(*e.answers[0]) if e.answers else None for e in examples],
                                     keep_offsets=run.split != "train")
    with ArrowStreams({name: part_file(run.parts, run.split, name, run.index) for name in ("windows", "examples")}) \
            as files:
        files.write("windows", _window_table(features))
        files.write("examples", _example_table(examples))
    return len(examples), {run.split: features.stats}


def _write_split(building: Path, split: str, examples: list[SquadExample], pool: ProcessPoolExecutor | None,
                 num_proc: int) -> SquadStats:
    """The windows and questions of one split, in input order; an empty split still gets its (empty) files."""
    size = max(1, min(QUESTIONS_PER_TASK, -(-len(examples) // (4 * num_proc))))  # about four runs per process
    runs = [QuestionRun(index, split, examples[first:first + size], building / "parts")
            for index, first in enumerate(range(0, max(len(examples), 1), size))]
    stats = run_tasks(runs, pool, _featurize_run, {split: SquadStats()}, num_proc, False, len(examples))
    join_parts(building, split, len(runs))
    return stats[split]


def _window_table(features: SquadFeatures) -> pa.Table:
    ids = features.input_ids
    arrays = {"input_ids": pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), ids.shape[1])}
    arrays |= {name: pa.array(values) for name, values in features.columns.items()}
    starts = np.concatenate([[0], np.cumsum(2 * features.offset_counts)]).astype(np.int32)
    arrays["offsets"] = pa.ListArray.from_arrays(pa.array(starts), pa.array(features.offsets, type=pa.int32()))
    return pa.table(arrays)


def _example_table(examples: Sequence[SquadExample]) -> pa.Table:
    return pa.table({
        "id": pa.array([e.id for e in examples], pa.string()),
        "title": pa.array([e.title for e in examples], pa.string()),
        "question": pa.array([e.question for e in examples], pa.string()),
        "context": pa.array([e.context for e in examples], pa.string()),
        "answer_text": pa.array([[text for text, _ in e.answers] for e in examples], pa.list_(pa.string())),
        "answer_start": pa.array([[start for _, start in e.answers] for e in examples], pa.list_(pa.int32())),
    })


# --- the summary -----------------------------------------------------------------------------------------

def _summary(request: SquadCacheRequest, read: list[SquadRecords], stats: dict[str, SquadStats], read_seconds: float,
             seconds: float) -> dict[str, Any]:
    questions = sum(len(r.examples) for r in read)
    return {
        "format": FORMAT_VERSION,
        "fingerprint": request.fingerprint(),
        "sources": {r.source: {"records": r.records, "bad_records": r.bad, "bad_record_reports": r.reports}
                    for r in read},
        "labelled": request.labelled,
        "settings": asdict(request.settings),
        "validation_fraction": request.validation_fraction,
        "questions": questions,
        "splits": {split: {**asdict(s), "windows_per_question": round(s.windows / max(s.examples, 1), 2)}
                   for split, s in stats.items()},
        "read_seconds": round(read_seconds, 2),
        "build_seconds": round(seconds, 2),
        "questions_per_second": round(questions / max(seconds, 1e-9), 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"  {source}: {s['records']} questions ({s['bad_records']} malformed, skipped)"
             for source, s in summary["sources"].items()]
    lines += [f"    {report}" for s in summary["sources"].values() for report in s["bad_record_reports"][:5]]
    lines.append(f"  built in {summary['build_seconds']} s ({summary['questions_per_second']} questions/s)")
    for split, s in summary["splits"].items():
        if not summary["labelled"]:
            lines.append(f"  {split}: {s['examples']} questions; {s['windows']} windows "
                         f"({s['windows_per_question']} per question)")
            continue
        lines.append(f"  {split}: {s['examples']} questions ({s['answerable']} answerable, {s['unanswerable']} "
                     f"unanswerable); {s['windows']} windows ({s['windows_per_question']} per question), "
                     f"{s['positive']} with an answer; {s['unreachable']} of {s['answerable']} answers fit no window")
    return "\n".join(lines)


# --- reading ---------------------------------------------------------------------------------------------

class SquadWindows(StoredWindows):
    """The windows of one split of a SQuAD cache as a map-style dataset of dicts of numpy arrays (the loader's collate
    makes tensors). ``attention_mask`` and ``token_type_ids`` are rebuilt from the stored lengths and segment
    starts; answers lie in the context part (``context_start`` to ``context_end``)."""

    SCALARS = ("length", "context_start", "context_end", "segment_start", "example_index", "start_position",
               "end_position", "answer_type")
    KIND = "SQuAD"

    def __init__(self, directory: Path, split: str = "train") -> None:
        super().__init__(directory, split)
        self.offsets_column = self.table.column("offsets")
        self.document_begin = self.columns["context_start"]
        self.document_end = self.columns["context_end"]

    def token_type_ids(self, index: int, attention_mask: np.ndarray) -> np.ndarray:
        return attention_mask * (self.positions >= self.columns["segment_start"][index])

    def offsets(self) -> list[np.ndarray]:
        """Every window's context-token character offsets, (tokens, 2) each (for decoding; one pass). The training
        split keeps none (nothing decodes its windows): there each is empty."""
        return [pairs.reshape(-1, 2) for pairs in list_rows(self.offsets_column)]


def open_examples(directory: Path, split: str) -> pa.Table:
    """The question rows of one split (ids, contexts, answers), memory-mapped."""
    path = Path(directory) / split / "examples.arrow"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {directory} a complete SQuAD feature cache?")
    return read_table(path)
