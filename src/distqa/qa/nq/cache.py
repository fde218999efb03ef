"""The NQ feature cache: featurise a jsonl file once, in parallel, into memory-mapped Arrow files.

Layout (one directory per fingerprint, so a changed input, tokenizer or window setting never
reuses stale features)::

    <nq_cache_dir>/<input file stem>-<fingerprint>/
      manifest.json                  settings, source, counts and the summary of the build
      train/windows.arrow            one row per kept window: input_ids[max_seq_len], length,
      train/examples.arrow           question_len, doc_start, labels ...; one row per example:
      validation/...                 example_id, piece_to_token, candidates, gold spans ...
      test/...                       (unlabelled input: every window of every example)

The files are Arrow IPC streams (the format of Hugging Face ``datasets``:
``datasets.Dataset.from_file(".../train/examples.arrow")`` opens one for inspection) and are read
memory-mapped: every rank of a node shares one copy in the page cache, and opening costs nothing.

Building: :func:`~distqa.qa.nq.reader.scan` checks every line first (cheap next to tokenisation, and a bad
file fails in seconds, not hours), the split is drawn from the scanned answer types, then
``num_proc`` processes each featurise disjoint runs of lines (re-read by byte offset) into part
files, and the parts are joined in input order. At most two tasks per process are in flight, so
memory stays flat whatever the file size. The directory appears atomically (built under a
temporary name, then renamed), so an interrupted build leaves nothing that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from distqa.config.errors import DataError
from distqa.encoders.template import PairTemplate
from distqa.qa.answers import AnswerType
from distqa.qa.bad_records import BadLinePolicy
from distqa.qa.feature_store import MANIFEST, StoredWindows, building_directory, hash_source, load_manifest, read_table
from distqa.qa.feature_store import cached as cached  # the NQ cache's lookup, with its request
from distqa.qa.featurize import featurising_pool, join_parts, run_tasks
from distqa.qa.nq.featurize import featurize_run, init_worker, make_runs
from distqa.qa.nq.reader import ScanResult, require_file, scan
from distqa.qa.nq.windows import WindowSettings, WindowStats

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bump when the features change meaning, so old caches are not reused."""


@dataclass(frozen=True)
class CacheRequest:
    """Everything that determines the content of a cache (and hence its fingerprint)."""

    source: Path
    labelled: bool
    settings: WindowSettings
    validation_fraction: float
    tokenizer_json: str
    template: PairTemplate
    """The tokenizer's pair format (read from ``tokenizer_json``'s post-processor)."""
    pad_id: int

    @classmethod
    def from_tokenizer(cls, source: Path, tokenizer: Any, settings: WindowSettings, labelled: bool = True,
                       validation_fraction: float = 0.0) -> CacheRequest:
        """``tokenizer``: a ``transformers`` fast tokenizer. ValueError when its pair template leaves
        ``settings`` no room for the document (naming the setting)."""
        if not getattr(tokenizer, "is_fast", False):
            raise DataError(f"tokenizer {type(tokenizer).__name__} is not a fast tokenizer; NQ featurisation "
                            "needs one (a tokenizer.json; every BERT-family model on the hub has one)")
        template = PairTemplate.of(tokenizer.backend_tokenizer)
        template.check_shape(settings.max_seq_len, settings.max_question_len, settings.doc_stride)
        return cls(require_file(source), labelled, settings, validation_fraction if labelled else 0.0,
                   tokenizer.backend_tokenizer.to_str(), template, tokenizer.pad_token_id)

    def fingerprint(self) -> str:
        """Hash of the input's content sample and size, the tokenizer and every window setting.

        The input is identified by its size and 16 sampled blocks rather than a full hash (a full
        read of 16 GB would cost minutes at every start), and not by its path or mtime, which
        change when the file is copied to storage.
        """
        digest = hashlib.sha256()
        digest.update(json.dumps(self.hashed_settings(), sort_keys=True).encode())
        digest.update(hashlib.sha256(self.tokenizer_json.encode()).digest())
        hash_source(digest, self.source)
        return digest.hexdigest()[:16]

    def hashed_settings(self) -> dict[str, Any]:
        """What the fingerprint hashes besides the tokenizer and the input: the format, the window settings and the
        pair template the windows are laid out with."""
        return {"format": FORMAT_VERSION, "labelled": self.labelled, "settings": asdict(self.settings),
                "validation_fraction": self.validation_fraction, "template": self.template.to_dict(),
                "pad_id": self.pad_id}

    def directory(self, cache_dir: Path) -> Path:
        return Path(cache_dir) / f"{self.source.stem}-{self.fingerprint()}"

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "validation") if self.labelled else ("test",)


def build_cache(request: CacheRequest, cache_dir: Path, num_proc: int = 1, on_bad_line: BadLinePolicy = "skip",
                max_bad_line_fraction: float = 0.01, progress: bool = True) -> Path:
    """Featurise ``request.source`` into ``cache_dir`` unless an identical cache exists; return its path."""
    final = request.directory(cache_dir)
    if (final / MANIFEST).is_file():
        log.info("reusing the NQ feature cache %s\n%s", final, format_summary(load_manifest(final)))
        return final
    started = time.perf_counter()
    # The featurising processes start first: they load while this process scans the file.
    with featurising_pool(request, num_proc, init_worker) as pool:
        log.info("scanning %s", request.source)
        scanned = scan(request.source, request.labelled, on_bad_line, max_bad_line_fraction)
        splits = assign_splits(scanned, request.validation_fraction, request.settings.seed) if request.labelled \
            else np.zeros(len(scanned), dtype=np.int8)
        scan_seconds = time.perf_counter() - started
        with building_directory(final) as building:
            (building / "parts").mkdir(parents=True)
            runs = list(make_runs(request, scanned, splits, building / "parts", num_proc))
            log.info("featurising %d examples with %d process(es) in %d tasks", len(scanned), num_proc, len(runs))
            stats = run_tasks(runs, pool, featurize_run, {split: WindowStats() for split in request.splits}, num_proc,
                              progress, total=len(scanned))
            for split in request.splits:
                join_parts(building, split, len(runs))
            shutil.rmtree(building / "parts")
            summary = _summary(request, scanned, stats, scan_seconds, time.perf_counter() - started)
            (building / MANIFEST).write_text(json.dumps(summary, indent=2) + "\n")
    log.info("NQ feature cache ready: %s\n%s", final, format_summary(summary))
    return final


def assign_splits(scanned: ScanResult, validation_fraction: float, seed: int) -> np.ndarray:
    """0 (train) or 1 (validation) per scanned example: by example, stratified by answer type.

    Within each answer type the examples are ordered by a hash of (seed, example_id) and the first
    ``round(fraction × count)`` go to validation: exact per-type proportions, and an example keeps
    its side when lines are reordered or appended.
    """
    splits = np.zeros(len(scanned), dtype=np.int8)
    keys = _mix64(scanned.example_ids.astype(np.uint64) ^ _mix64(np.array([seed], dtype=np.uint64)))
    for answer_type in AnswerType:
        members = np.flatnonzero(scanned.answer_types == answer_type)
        chosen = members[np.argsort(keys[members], kind="stable")][:round(validation_fraction * len(members))]
        splits[chosen] = 1
    return splits


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-mixed 64-bit hash (wrapping arithmetic is intended)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _summary(request: CacheRequest, scanned: ScanResult, stats: dict[str, WindowStats], scan_seconds: float,
             seconds: float) -> dict[str, Any]:
    splits = {}
    for split, s in stats.items():
        negatives = s.kept - s.positive
        splits[split] = {
            **asdict(s),
            "negative_kept": negatives,
            "windows_per_example": round(s.windows / max(s.examples, 1), 2),
            "kept_per_example": round(s.kept / max(s.examples, 1), 2),
            "positive_to_negative": f"1:{negatives / s.positive:.2f}" if s.positive else "no positives",
        }
    return {
        "format": FORMAT_VERSION,
        "fingerprint": request.fingerprint(),
        "source": str(request.source),
        "source_bytes": request.source.stat().st_size,
        "labelled": request.labelled,
        "settings": asdict(request.settings),
        "template": request.template.to_dict(),
        "validation_fraction": request.validation_fraction,
        "lines": scanned.total_lines,
        "examples": len(scanned),
        "bad_lines": scanned.bad_lines,
        "bad_line_reports": scanned.bad_reports,
        "splits": splits,
        "scan_seconds": round(scan_seconds, 2),
        "build_seconds": round(seconds, 2),
        "examples_per_second": round(len(scanned) / max(seconds, 1e-9), 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"  {summary['examples']} examples from {summary['lines']} lines "
             f"({summary['bad_lines']} malformed, skipped) in {summary['build_seconds']} s "
             f"({summary['examples_per_second']} examples/s)"]
    lines += [f"    {line}" for line in summary["bad_line_reports"][:5]]
    for split, s in summary["splits"].items():
        if not summary["labelled"]:  # no answers to count
            lines.append(f"  {split}: {s['examples']} unlabelled examples; {s['windows']} windows "
                         f"({s['windows_per_example']} per example)")
            continue
        types = ", ".join(f"{name.lower()} {count}" for name, count in s["by_type"].items())
        lines.append(f"  {split}: {s['examples']} examples ({types}); {s['windows']} windows "
                     f"({s['windows_per_example']} per example), {s['kept']} kept = {s['positive']} with an "
                     f"answer + {s['negative_kept']} without ({s['positive_to_negative']}); "
                     f"{s['unreachable']} of {s['answerable']} answers fit no window")
    return "\n".join(lines)


# --- reading -----------------------------------------------------------------------------------

class NQWindows(StoredWindows):
    """The windows of one split of an NQ cache, as DummyDataset-shaped items: dicts of numpy arrays (the
    DataLoader's default collate turns them into tensors); ``attention_mask`` and ``token_type_ids`` are rebuilt
    from the stored lengths and the cache's window template."""

    SCALARS = ("length", "question_len", "example_index", "doc_start", "start_position", "end_position",
               "answer_type")
    KIND = "NQ"

    def __init__(self, directory: Path, split: str = "train") -> None:
        super().__init__(directory, split)
        self.template = window_template(Path(directory))
        self.document_begin = self.template.document_offset(self.columns["question_len"])
        self.document_end = self.columns["length"] - len(self.template.suffix)

    def token_type_ids(self, index: int, attention_mask: np.ndarray) -> np.ndarray:
        return self.template.token_type_ids(self.columns["question_len"][index], attention_mask)


def window_template(directory: Path) -> PairTemplate:
    """The window template of a cache, from its manifest."""
    template = load_manifest(directory).get("template")
    if not template:
        raise DataError(f"{directory} is an NQ feature cache from before distqa 0.2.0 (its manifest has no window "
                        "template); build it again: python -m distqa.prepare with the run's settings.")
    return PairTemplate.from_dict(template)


def open_examples(directory: Path, split: str) -> pa.Table:
    """The example rows of one split (ids, questions, wordpiece → token maps, candidates, gold spans),
    memory-mapped."""
    path = Path(directory) / split / "examples.arrow"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; is {directory} a complete NQ feature cache?")
    return read_table(path)
