"""Framework overhead: our trainer's optimizer step against a minimal hand-written PyTorch loop.

    .venv/bin/python bench/step_overhead.py           # about a minute on 2 cores
    .venv/bin/python bench/step_overhead.py --quick   # smoke test

Both contenders train the same model (the tiny-cpu preset: tiny BERT from data/tiny-bert's config,
fp32 on CPU), from the same initial weights, on the same pre-collated DummyDataset micro-batches
(per-rank batch 8, 4 micro-batches per step: global batch 32 on one process), with the same AdamW
(``distqa.training.optim.build_optimizer``: fused, weight decay on matrices only), gradient clipping and schedule:

  ours   ``distqa.training.trainer.Trainer.train_step``, which ``Trainer.fit`` calls once per optimizer step
  hand   forward, loss / accumulation, backward per micro-batch; clip, step, schedule, zero_grad

The data are collated beforehand so that only the step is timed. Before timing, one step of each from
the same weights and the same RNG state must give the same weights (to 1e-6): the same work is compared.
Target: ours <= 1.05 × hand, in median seconds per optimizer step.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import torch
from harness import (
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    hand_written_step,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    seconds_per_step,
    step_time_rows,
)

from distqa.distributed.runtime import local_runtime
from distqa.training.trainer import Trainer

TARGET = 1.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=15)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per contender and repeat")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 3, 2
    pin_threads(args.threads)

    config = bench_config("--precision", args.precision, "--dummy-size", "256")
    dataset = dummy_dataset(config)
    runtime = local_runtime("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-step-") as run_dir:
        ours = build_our_trainer(config, runtime, dataset, Path(run_dir))
        hand = build_our_trainer(config, runtime, dataset, Path(run_dir))  # only its model/optimizer/schedule
        accumulation = ours.plan.accumulation
        batches = list(itertools.islice(iter(ours.loader), 4 * accumulation))

        difference = same_work(ours, hand, batches[:accumulation])
        if difference > 1e-6:
            raise SystemExit(f"the two loops do different work: weights differ by {difference:.2e} after one step")
        step_ours, step_hand = ours.train_step, hand_written_step(hand)
        figures = interleaved({
            "ours": lambda: seconds_per_step(step_ours, batches, args.steps),
            "hand": lambda: seconds_per_step(step_hand, batches, args.steps),
        }, args.repeats)

    print(machine_line(args.threads))
    print(f"model: tiny BERT ({sum(p.numel() for p in ours.model.parameters()) / 1e6:.2f}M parameters), "
          f"{args.precision}, max_seq_len {config.max_seq_len}, per-rank batch {config.per_rank_batch_size} × "
          f"{accumulation} micro-batches per step; {args.steps} steps per repeat; one step of each from the "
          f"same weights: max weight difference {difference:.1e}")
    rows = step_time_rows(figures)
    print_table("framework overhead (median time per optimizer step):", rows)
    print_targets([Target("ours / hand-written loop, time per step", median(figures["ours"]) / median(figures["hand"]),
                          TARGET, at_most=True)])


def same_work(ours: Trainer, hand: Trainer, batches: list[dict[str, torch.Tensor]]) -> float:
    """One step of each from the same RNG state; the largest difference between their weights after it."""
    torch.manual_seed(1)
    ours.train_step(iter(batches))
    torch.manual_seed(1)
    hand_written_step(hand)(iter(batches))
    return max((a - b).abs().max().item() for a, b in zip(ours.model.parameters(), hand.model.parameters(),
                                                          strict=True))


if __name__ == "__main__":
    main()
