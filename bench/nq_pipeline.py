"""NQ featurisation speed and memory, measured side by side on one synthetic corpus.

    .venv/bin/python bench/nq_pipeline.py                 # ~3 minutes on 2 cores
    .venv/bin/python bench/nq_pipeline.py --examples 100  # a quick look

Rows (all on the same generated Kaggle-format file, tiny-bert tokenizer):

  (a) this pipeline: ``python -m distqa.prepare`` (scan + featurise with one process per core + join)
  (b) the 2020 recipe's approach, re-implemented: per line ``json.loads``, then one
      ``tokenizer.encode`` call per whitespace token, Python lists for the token map and windows
  (c) the floor: ``encode_batch`` of the same documents, already in memory, nothing else

and the targets this recipe holds itself to: (a) >= 10x (b) in examples/s, (a) within 1.5x of (c),
peak RSS of (a) on a 10x larger input <= 1.2x its peak on the base input (the whole process tree:
the prepare process and its workers), and >= 20k cached windows/s read through a DataLoader on one
core. Ratios matter, not absolute numbers: the machine may be busy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from distqa.config import TINY_MODEL_DIR
from distqa.data.cache import NQWindows
from distqa.data.synthetic_nq import write_jsonl

MAX_SEQ_LEN, MAX_QUESTION_LEN, DOC_STRIDE = 128, 32, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="examples in the base corpus")
    parser.add_argument("--min-doc-tokens", type=int, default=2000)
    parser.add_argument("--max-doc-tokens", type=int, default=15000)
    parser.add_argument("--baseline-examples", type=int, default=30, help="examples timed for (b), which is slow")
    parser.add_argument("--scale", type=int, default=10, help="size of the larger input, in base corpora")
    args = parser.parse_args()
    num_proc = os.cpu_count() or 1

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
        reading = read_windows(Path(pipeline["cache"]))

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
        ("(a) / (b) >= 10", a / b, a / b >= 10),
        ("(c) / (a) <= 1.5", c / a, c / a <= 1.5),
        (f"peak RSS {args.scale}x / 1x <= 1.2", rss_ratio, rss_ratio <= 1.2),
        ("reading >= 20k windows/s", reading / 1000, reading >= 20_000),
    ]
    print()
    for name, value, ok in targets:
        print(f"{'PASS' if ok else 'MISS'}  {name:<28} {value:8.2f}")


def run_prepare(source: Path, cache_dir: Path, num_proc: int) -> dict:
    """(a): the real command in its own process; peak RSS summed over its process tree."""
    command = [sys.executable, "-m", "distqa.prepare", "--preset", "tiny-cpu", "--nq-train-file", str(source),
               "--nq-cache-dir", str(cache_dir), "--num-proc", str(num_proc), "--progress-bar", "false",
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
    """(b): the 2020 way, one tokenizer call per word, windows and labels built in Python lists."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    lines = source.read_text().splitlines()[:count]
    started = time.perf_counter()
    windows = 0
    for raw in lines:
        record = json.loads(raw)
        question = tokenizer.encode(record["question_text"], add_special_tokens=False)[:MAX_QUESTION_LEN]
        pieces, piece_to_token = [], []
        for index, word in enumerate(record["document_text"].split(" ")):
            if word.startswith("<") and word.endswith(">"):
                continue
            for piece in tokenizer.encode(word, add_special_tokens=False):
                pieces.append(piece)
                piece_to_token.append(index)
        annotation = record["annotations"][0]
        long = annotation["long_answer"]
        room = MAX_SEQ_LEN - len(question) - 3
        start = 0
        while True:
            window = [tokenizer.cls_token_id, *question, tokenizer.sep_token_id, *pieces[start:start + room],
                      tokenizer.sep_token_id]
            window += [tokenizer.pad_token_id] * (MAX_SEQ_LEN - len(window))
            tokens = piece_to_token[start:start + room]
            has_answer = long["start_token"] >= 0 and tokens and tokens[0] <= long["start_token"] \
                and long["end_token"] <= tokens[-1] + 1
            windows += 1 + int(bool(has_answer))
            if start + room >= len(pieces):
                break
            start += DOC_STRIDE
    return len(lines) / (time.perf_counter() - started)


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
