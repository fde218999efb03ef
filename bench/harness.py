"""What every benchmark in bench/ shares: pinned threads, interleaved repeats, medians, the report's format.

A benchmark compares contenders side by side in one run: each repeat runs every contender once, in an
order that alternates (A B, B A, A B …), so that a burst of load from another process on a shared
machine hits all of them alike; the figure of a contender is its median over the repeats. Ratios of
medians are what the targets judge; absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from our_trainer import build_our_trainer as build_our_trainer  # re-exported: the benchmarks import it from here
from targets import Target  # re-exported: every benchmark imports it from here
from torch.utils.data import Dataset

from distqa.config.sources import load_config
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.config import QAConfig
from distqa.qa.model import forward, qa_loss
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.prepared import prepare_nq
from distqa.qa.nq.synthetic import write_jsonl
from distqa.tasks import make_task
from distqa.training.trainer import Trainer

T = TypeVar("T")


def add_common_arguments(parser: argparse.ArgumentParser, default_repeats: int) -> None:
    """``--threads``, ``--repeats`` and ``--quick``, the same in every script."""
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per process (default 1: the machine is shared)")
    parser.add_argument("--repeats", type=int, default=default_repeats, help="interleaved repeats per contender")
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny sizes, 3 repeats, figures meaningless")


def pin_threads(threads: int) -> None:
    """One fixed number of torch threads for every contender (and no inter-op pool growing behind it)."""
    if threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    # Set once per process, before any inter-op work; calling it twice raises, hence the guard.
    if torch.get_num_interop_threads() != threads:
        torch.set_num_interop_threads(threads)


def machine_line(threads: int, processes: int = 1) -> str:
    """Where the figures come from: cores, CPU model, torch version, threads in use."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    return (f"machine: {os.cpu_count()} cores, {model}, {platform.machine()}; torch {torch.__version__}; "
            f"{threads} torch thread(s) per process × {processes} process(es); load average "
            f"{os.getloadavg()[0]:.2f} (a shared machine: other work shifts the absolute figures, "
            "much less the interleaved ratios)")


def interleaved(contenders: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call every contender once per repeat, alternating the order; each call returns its own figure
    (seconds per step, or items per second). Returns every figure by contender."""
    names = list(contenders)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            figures[name].append(contenders[name]())
    return figures


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def print_table(title: str, rows: Sequence[tuple[str, str, str]]) -> None:
    """Rows of (contender, median figure, note), aligned."""
    print(title)
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>{value_width}}   {note}")


def step_time_rows(figures: dict[str, list[float]], decimals: int = 2) -> list[tuple[str, str, str]]:
    """print_table's rows for contenders timed in seconds per step: the median in ms, and the repeats' range."""
    return [(name, f"{1000 * median(values):.{decimals}f} ms/step", spread([1000 * v for v in values]))
            for name, values in figures.items()]


def print_targets(targets: Sequence[Target]) -> None:
    print()
    for target in targets:
        print(target.line())


def spread(values: Sequence[float]) -> str:
    """The range of the repeats, as a note next to their median."""
    return f"median of {len(values)}, range {min(values):.4g}..{max(values):.4g}"


# --- our trainer (our_trainer.build_our_trainer), over the QA model's configurations -------------------
BENCH_SEED = 0
"""The seed of every benchmark's run (``--seed``), ours and transformers.Trainer's alike (bench/hf_trainer.py)."""


def bench_config(*overrides: str) -> QAConfig:
    """The tiny-cpu preset (tiny BERT from data/tiny-bert's config, DummyDataset) with ``overrides``
    (command-line flags of ``python -m distqa.train``), never reading .env or DISTQA_* variables."""
    return load_config(["--preset", "tiny-cpu", "--progress-bar", "false", "--tensorboard", "false",
                        "--max-steps", "1000000", "--seed", str(BENCH_SEED), *overrides], environ={},
                       dotenv_path=os.devnull)


def hand_written_step(trainer: Trainer) -> Callable[[Iterator[dict[str, torch.Tensor]]], None]:
    """The minimal training step, written as a PyTorch tutorial would, over ``trainer``'s model, optimizer,
    schedule and precision: the yardstick of framework overhead (no DDP, no loss scaling, no metrics)."""
    model, optimizer, scheduler = trainer.model, trainer.optimizer, trainer.scheduler
    accumulation, max_grad_norm = trainer.plan.accumulation, trainer.config.max_grad_norm
    autocast = trainer.precision.autocast  # fp32: a null context; bf16: torch.autocast("cpu", bfloat16)

    def step(micro_batches: Iterator[dict[str, torch.Tensor]]) -> None:
        for _ in range(accumulation):
            batch = next(micro_batches)
            with autocast():
                loss = qa_loss(forward(model, batch), batch) / accumulation
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def nq_windows(work: Path, *flags: str) -> tuple[tuple[str, ...], NQWindows]:
    """The training windows of an NQ file featurised into a cache under ``work`` (``flags`` pick the file,
    default the committed sample), and the flags that make ``bench_config`` read them."""
    flags = ("--task", "nq", "--nq-cache-dir", str(work / "cache"), "--num-proc", "1", *flags)
    config = bench_config(*flags)
    return flags, NQWindows(prepare_nq(config, load_tokenizer(config), progress=False), "train")


def short_document_windows(work: Path, examples: int = 2000) -> tuple[tuple[str, ...], NQWindows]:
    """Windows of synthetic NQ documents of 10 to 60 words (``distqa.qa.nq.synthetic``), every one kept: what
    SQuAD-like data looks like, where whole batches are shorter than max_seq_len (the NQ sample's documents run
    to thousands of tokens, so nearly every batch holds a full window)."""
    path = work / "short-documents" / "simplified-nq-train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, examples, seed=0, min_doc_tokens=10, max_doc_tokens=60)
    return nq_windows(work, "--nq-train-file", str(path), "--negative-keep-rate", "1")


def dummy_dataset(config: QAConfig) -> Dataset:
    """The DummyDataset of ``config`` (about a third of its windows shorter than max_seq_len)."""
    return make_task(config).train_dataset()


def seconds_per_step(step: Callable[[Iterator[dict[str, torch.Tensor]]], object],
                     batches: list[dict[str, torch.Tensor]], steps: int) -> float:
    """Seconds per call, the mean of ``steps`` calls of ``step`` over ``batches`` (cycled), after one untimed
    call that lets caches and the allocator settle after another contender ran."""
    micro_batches = itertools.cycle(batches)
    step(micro_batches)
    started = time.perf_counter()
    for _ in range(steps):
        step(micro_batches)
    return (time.perf_counter() - started) / steps


def endless(loader: Iterable[T]) -> Iterator[T]:
    """The loader's batches, epoch after epoch (a new iterator per epoch, as the trainer makes)."""
    while True:
        yield from loader
