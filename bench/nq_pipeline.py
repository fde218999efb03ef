"""NQ featurisation speed and memory, measured side by side on one synthetic corpus.

    .venv/bin/python bench/nq_pipeline.py                 # about 3 minutes on 2 cores
    .venv/bin/python bench/nq_pipeline.py --examples 100  # a quick look
    .venv/bin/python bench/nq_pipeline.py --quick         # smoke test (seconds; figures meaningless)

Rows (all on the same generated Kaggle-format file, tiny-bert tokenizer):

  (a) this pipeline: ``python -m distqa.prepare`` (scan + featurise with one process per core + join)
  (b) the 2020 recipe's featurisation, re-implemented call for call (see per_word_baseline): one
      ``tokenizers`` ``encode`` call per whitespace token, Python lists for the token map
  (c) the floor: ``encode_batch`` of the same documents, already in memory, nothing else

and the targets this recipe holds itself to: (a) >= 10x (b) in examples/s, (a) within 1.5x of (c),
peak RSS of (a) on a 10x larger input <= 1.2x its peak on the base input (the whole process tree:
the prepare process and its workers), and >= 20k cached windows/s read through a DataLoader on one
core. Ratios matter, not absolute numbers: the machine may be busy.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from harness import Target, machine_line, print_targets
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from distqa.encoders.config import TINY_MODEL_DIR
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.synthetic import write_jsonl

MAX_SEQ_LEN, MAX_QUESTION_LEN, DOC_STRIDE = 128, 32, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1000, help="examples in the base corpus")
    parser.add_argument("--min-doc-tokens", type=int, default=2000)
    parser.add_argument("--max-doc-tokens", type=int, default=15000)
    parser.add_argument("--baseline-examples", type=int, default=50, help="examples timed for (b), which is slow")
    parser.add_argument("--scale", type=int, default=10, help="size of the larger input, in base corpora")
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny sizes, figures meaningless")
    args = parser.parse_args()
    if args.quick:
        args.examples, args.scale, args.baseline_examples = 20, 2, 5
        args.min_doc_tokens, args.max_doc_tokens = 500, 2000
    num_proc = os.cpu_count() or 1
    print(machine_line(threads=1) + f"; prepare runs {num_proc} featurising processes")

    with tempfile.TemporaryDirectory(prefix="nq-bench-") as tmp:
        work = Path(tmp)
        base, large = work / "base.jsonl", work / "large.jsonl"
        lengths = {"min_doc_tokens": args.min_doc_tokens, "max_doc_tokens": args.max_doc_tokens}
        write_jsonl(base, args.examples, seed=0, **lengths)
        write_jsonl(large, args.examples * args.scale, seed=0, **lengths)
        print(f"corpus: {args.examples} examples, {base.stat().st_size / 1e6:.1f} MB "
              f"(larger input: {large.stat().st_size / 1e6:.1f} MB); {num_proc} cores; tiny-bert tokenizer")

        pipeline = run_prepare(base, work / "cache-base", num_proc)
        pipeline_large = run_prepare(large, work / "cache-large", num_proc)
        baseline = per_word_baseline(base, args.baseline_examples)
        floor = encode_batch_floor(base)
        reading = read_windows(Path(pipeline["cache"]), seconds=0.5 if args.quick else 3.0)

    a, b, c = pipeline["examples_per_s"], baseline, floor
    rss_ratio = pipeline_large["peak_rss_mb"] / pipeline["peak_rss_mb"]
    rows = [
        ("(a) this pipeline (prepare, in-process time)", f"{a:9.1f} examples/s",
         f"wall incl. start-up {pipeline['wall_s']:.1f} s, peak RSS {pipeline['peak_rss_mb']:.0f} MB"),
        ("(b) 2020 per-word encode loop", f"{b:9.1f} examples/s", f"on the first {args.baseline_examples} examples"),
        ("(c) floor: bare encode_batch", f"{c:9.1f} examples/s", "documents already in memory"),
        (f"(a) on the {args.scale}x input", f"{pipeline_large['examples_per_s']:9.1f} examples/s",
         f"peak RSS {pipeline_large['peak_rss_mb']:.0f} MB"),
        ("reading cached windows (1 core, DataLoader)", f"{reading:9.0f} windows/s", "batch 32, no workers"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for name, value, note in rows:
        print(f"{name:<{width}}  {value}   {note}")
    targets = [
        Target("(a) / (b), examples/s", a / b, 10, at_most=False),
        Target("(c) / (a), examples/s", c / a, 1.5, at_most=True),
        Target(f"peak RSS {args.scale}x / 1x", rss_ratio, 1.2, at_most=True),
        Target("reading, thousand windows/s", reading / 1000, 20, at_most=False),
    ]
    print_targets(targets)


def run_prepare(source: Path, cache_dir: Path, num_proc: int) -> dict:
    """(a): the real command in its own process; peak RSS summed over its process tree."""
    command = [sys.executable, "-m", "distqa.prepare", "--preset", "tiny-cpu", "--task", "nq", "--nq-train-file",
               str(source), "--nq-cache-dir", str(cache_dir), "--num-proc", str(num_proc), "--progress-bar", "false",
               "--max-seq-len", str(MAX_SEQ_LEN), "--max-question-len", str(MAX_QUESTION_LEN),
               "--doc-stride", str(DOC_STRIDE)]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = TreeMemory(process.pid)
    peak.start()
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    peak.stop()
    if process.returncode:
        raise SystemExit(f"prepare failed:\n{stderr}")
    cache = Path(stdout.strip())
    manifest = json.loads((cache / "manifest.json").read_text())
    return {"cache": str(cache), "wall_s": wall, "peak_rss_mb": peak.peak / 2**20,
            "examples_per_s": manifest["examples"] / manifest["build_seconds"]}


class TreeMemory(threading.Thread):
    """Polls the summed resident memory of a process and all of its descendants."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, sum(_rss(pid) for pid in _tree(self.pid)))
            time.sleep(0.02)

    def stop(self) -> None:
        self.running = False
        self.join()


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    pids, queue = [], [root]
    while queue:
        pid = queue.pop()
        pids.append(pid)
        queue += children.get(pid, [])
    return pids


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def per_word_baseline(source: Path, count: int) -> float:
    """(b): the 2020 recipe's featurisation, call for call: the line through ``linecache`` and
    ``json.loads``, ``split()``, a regex test and one ``tokenizers`` ``encode`` per word with Python
    lists for the token maps, then (start, end, label) for every stride window, of which one is
    drawn and materialised (it ran in ``__getitem__``, once per example and epoch)."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    backend = tokenizer.backend_tokenizer  # the 2020 code called tokenizers' BertWordPieceTokenizer directly
    rng = np.random.default_rng(0)
    linecache.getline(str(source), 1)  # linecache reads the whole file once; not timed
    started = time.perf_counter()
    for line_number in range(1, count + 1):
        record = json.loads(linecache.getline(str(source), line_number))
        o2t, encoded = [], []
        for word in record["document_text"].split():
            o2t.append(len(encoded))
            if re.match(r"<.+>", word):
                continue
            encoded.extend(backend.encode(word, add_special_tokens=False).ids)
        question = backend.encode(record["question_text"], add_special_tokens=False).ids[:MAX_QUESTION_LEN]
        long = record["annotations"][0]["long_answer"]
        start_position, end_position = (o2t[long["start_token"]], o2t[long["end_token"] - 1]) \
            if long["start_token"] >= 0 else (-1, -1)
        document_len = MAX_SEQ_LEN - len(question) - 3
        samples = []
        for doc_start in range(0, len(encoded), DOC_STRIDE):
            doc_end = doc_start + document_len
            inside = doc_start <= start_position and end_position <= doc_end
            samples.append((start_position - doc_start if inside else -1, doc_start, doc_end))
        _, doc_start, doc_end = samples[int(rng.integers(len(samples)))]
        input_ids = [tokenizer.cls_token_id, *question, tokenizer.sep_token_id, *encoded[doc_start:doc_end],
                     tokenizer.sep_token_id]
        assert len(input_ids) <= MAX_SEQ_LEN
    return count / (time.perf_counter() - started)


def encode_batch_floor(source: Path) -> float:
    """(c): the fast tokenizer on the raw document texts, on every core, and nothing else."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR).backend_tokenizer
    documents = [json.loads(raw)["document_text"] for raw in source.read_text().splitlines()]
    started = time.perf_counter()
    for start in range(0, len(documents), 64):
        tokenizer.encode_batch(documents[start:start + 64], add_special_tokens=False)
    return len(documents) / (time.perf_counter() - started)


def read_windows(cache: Path, seconds: float = 3.0) -> float:
    """Cached windows per second through a DataLoader, one thread, no worker processes."""
    torch.set_num_threads(1)
    windows = NQWindows(cache, "train")
    loader = DataLoader(windows, batch_size=32, shuffle=True, drop_last=True)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for batch in loader:
            count += len(batch["input_ids"])
    elapsed = time.perf_counter() - started
    assert np.isfinite(count / elapsed)
    return count / elapsed


if __name__ == "__main__":
    main()
