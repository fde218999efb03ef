"""Loader against step: how much faster the NQ feature cache feeds windows than the model trains on them.

    .venv/bin/python bench/loader_vs_step.py           # about a minute on 2 cores
    .venv/bin/python bench/loader_vs_step.py --quick   # smoke test

The committed sample (data/nq-sample, tiny-cpu window settings) is featurised by ``distqa.prepare``'s
own code into a temporary cache; then, interleaved:

  loader  windows/s out of ``distqa.train.build_loader`` over ``NQWindows`` (memory-mapped Arrow,
          ``ResumableDistributedSampler``, per-rank batch 8, the preset's workers: none), epoch after epoch
  step    windows/s through ``distqa.training.trainer.Trainer.train_step`` (tiny BERT, fp32, 4 micro-batches
          of 8 per optimizer step) on batches of that loader collated beforehand

Target: loader >= 10 × step, so the data never holds the model up (on one core each; GPUs raise the
step's rate, which is what the preset's data-loader workers are for).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import tempfile
import time
from pathlib import Path

import torch
from harness import (
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    endless,
    interleaved,
    machine_line,
    median,
    nq_windows,
    pin_threads,
    print_table,
    print_targets,
    spread,
)
from torch.utils.data import DataLoader

from distqa.config import Config
from distqa.distributed.runtime import local_runtime
from distqa.tasks import make_task
from distqa.train import build_loader
from distqa.training.trainer import Trainer

TARGET = 10.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=9)
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per contender and repeat")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds = 3, 0.5
    pin_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)

    runtime = local_runtime("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as work:
        flags, windows = nq_windows(Path(work))
        config = bench_config(*flags)
        loader = build_loader(config, runtime, windows, make_task(config).collate)
        trainer = build_our_trainer(config, runtime, windows, Path(work))
        batches = list(itertools.islice(endless(trainer.loader), 4 * trainer.plan.accumulation))
        figures = interleaved({
            "loader": lambda: loader_windows_per_s(loader, args.seconds),
            "step": lambda: step_windows_per_s(trainer, batches, config, args.seconds),
        }, args.repeats)

    print(machine_line(args.threads))
    print(f"data: {len(windows)} training windows of data/nq-sample (max_seq_len {config.max_seq_len}), "
          f"per-rank batch {config.per_rank_batch_size}, {config.num_workers} loader workers; model: tiny BERT, fp32; "
          f"{args.seconds:g} s per contender and repeat")
    rows = [(name, f"{median(values):.0f} windows/s", spread(values)) for name, values in figures.items()]
    print_table("loader against step (median throughput, one thread each):", rows)
    print_targets([Target("loader / step, windows/s", median(figures["loader"]) / median(figures["step"]),
                          TARGET, at_most=False)])


def loader_windows_per_s(loader: DataLoader, seconds: float) -> float:
    count, started = 0, time.perf_counter()
    for batch in endless(loader):
        count += len(batch["input_ids"])
        if time.perf_counter() - started >= seconds:
            break
    return count / (time.perf_counter() - started)


def step_windows_per_s(trainer: Trainer, batches: list[dict[str, torch.Tensor]], config: Config,
                       seconds: float) -> float:
    micro_batches = itertools.cycle(batches)
    trainer.train_step(micro_batches)  # warm
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or steps == 0:
        trainer.train_step(micro_batches)
        steps += 1
    return steps * config.global_batch_size / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
