"""DDP overhead on CPU: our trainer's step on 2 gloo processes against 1 process, same per-rank batch.

    .venv/bin/python bench/ddp_overhead.py           # about 2 minutes on 2 cores
    .venv/bin/python bench/ddp_overhead.py --quick   # smoke test

The script starts itself under ``torchrun --standalone --nproc-per-node 2`` (loopback, one torch thread
per process) and, in one job, interleaves three contenders, each running
``distqa.training.trainer.Trainer.train_step`` on the tiny-cpu model with per-rank batch 8 and 2 micro-batches
per optimizer step, on pre-collated DummyDataset batches:

  ddp         both ranks, the model wrapped by ``distqa.distributed.ddp.wrap_ddp`` (gloo all-reduce of the
              gradients on the last micro-batch, ``no_sync`` before it): global batch 32
  1 process   rank 0 alone with the bare model (global batch 16) while rank 1 waits, blocked, in a barrier
  2 × alone   both ranks at once, each with the bare model and no communication: what sharing the
              cores and memory costs, without DDP

and the DDP settings we measured, each a ``ddp`` contender with one change (the ``ddp_*`` settings, or
keyword arguments of DistributedDataParallel that are not settings). ``static_graph`` is not among them: with
``no_sync``, which our accumulation uses, torch 2.13 fails its first backward (pytorch#187732).

  buckets of 1 MB          --ddp-bucket-cap-mb 1 (the default 25 MB holds this model's 2.5 MB of gradients
                           in two buckets: DDP's first bucket is always 1 MB)
  batched_grad_copy        one copy and one division per bucket instead of one per parameter (torch 2.13)
  no grad bucket view      gradient_as_bucket_view false: gradients copied into the buckets

Target: ddp <= 1.10 × 1 process, in median seconds per optimizer step. ddp / 2 × alone is what the
gradient all-reduce and DDP's hooks cost beyond two processes merely running side by side.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from harness import (
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    seconds_per_step,
    step_time_rows,
)

from distqa.distributed.runtime import all_reduce_max, barrier, distributed_runtime
from distqa.training.trainer import Trainer

TARGET = 1.10
PER_RANK_BATCH, ACCUMULATION, WORLD_SIZE = 8, 2, 2
VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "ddp, buckets of 1 MB": ({"ddp_bucket_cap_mb": 1}, {}),
    "ddp, batched_grad_copy": ({}, {"batched_grad_copy": True}),
    "ddp, no grad bucket view": ({}, {"gradient_as_bucket_view": False}),
}
"""Name: (settings replaced, DistributedDataParallel keyword arguments replaced)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=11)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per contender and repeat")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set when torchrun starts us
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 3, 2
    if not args.worker:
        sys.exit(launch(sys.argv[1:], args.threads))
    pin_threads(args.threads)
    with distributed_runtime("cpu") as runtime:
        ddp_config = bench_config("--per-rank-batch-size", str(PER_RANK_BATCH),
                                  "--global-batch-size", str(PER_RANK_BATCH * ACCUMULATION * WORLD_SIZE),
                                  "--dummy-size", "512")
        local_config = replace(ddp_config, global_batch_size=PER_RANK_BATCH * ACCUMULATION)
        dataset = dummy_dataset(ddp_config)
        alone = replace(runtime, rank=0, world_size=1)  # this process as if it were the whole job
        with tempfile.TemporaryDirectory(prefix=f"bench-ddp-rank{runtime.rank}-") as run_dir:
            ddp = build_our_trainer(ddp_config, runtime, dataset, Path(run_dir))
            local = build_our_trainer(local_config, alone, dataset, Path(run_dir))
            variants = {name: build_our_trainer(replace(ddp_config, **settings), runtime, dataset, Path(run_dir),
                                                **ddp_options) for name, (settings, ddp_options) in VARIANTS.items()}
            assert ddp.plan.accumulation == local.plan.accumulation == ACCUMULATION
            batches = list(itertools.islice(iter(ddp.loader), 4 * ACCUMULATION))
            is_rank0 = runtime.rank == 0
            figures = interleaved({
                "ddp": lambda: collective_time(ddp, batches, args.steps, everyone=True),
                "1 process": lambda: collective_time(local, batches, args.steps, everyone=False),
                "2 × alone": lambda: collective_time(local, batches, args.steps, everyone=True),
                **{name: (lambda trainer=trainer: collective_time(trainer, batches, args.steps, everyone=True))
                   for name, trainer in variants.items()},
            }, args.repeats)
            if is_rank0:
                report(figures, args.threads, args.steps)


def collective_time(trainer: Trainer, batches: list[dict[str, torch.Tensor]], steps: int, everyone: bool) -> float:
    """Seconds per step of ``trainer`` on rank 0 and, when ``everyone``, on rank 1 too (which otherwise
    waits in a barrier); the slower rank's figure, which is what a DDP job runs at."""
    barrier()
    elapsed = 0.0
    if everyone or dist.get_rank() == 0:
        elapsed = seconds_per_step(trainer.train_step, batches, steps)
    barrier()
    # all_reduce_max takes integers: microseconds are fine-grained enough for steps of tens of ms.
    return all_reduce_max(round(elapsed * 1e6), torch.device("cpu")) / 1e6


def report(figures: dict[str, list[float]], threads: int, steps: int) -> None:
    print(machine_line(threads, processes=WORLD_SIZE))
    print(f"model: tiny BERT, fp32, max_seq_len 128; per-rank batch {PER_RANK_BATCH} × {ACCUMULATION} micro-batches "
          f"per step; gloo on loopback; {steps} steps per repeat")
    rows = step_time_rows(figures)
    print_table("DDP overhead on CPU (median time per optimizer step, slower rank):", rows)
    ddp = median(figures["ddp"])
    print(f"  ddp / 2 × alone (all-reduce and DDP hooks alone): {ddp / median(figures['2 × alone']):.3f}")
    for name in VARIANTS:
        print(f"  ddp / {name.removeprefix('ddp, ')}: {ddp / median(figures[name]):.3f} (above 1: it is faster)")
    print_targets([Target("ddp (2 gloo ranks) / 1 process, time per step", ddp / median(figures["1 process"]),
                          TARGET, at_most=True)])


def launch(argv: list[str], threads: int) -> int:
    """This script again, as 2 ranks under torchrun on loopback; rank 0 prints the report."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}",
               __file__, "--worker", *argv]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(command, env=environment, check=False).returncode


if __name__ == "__main__":
    main()
