"""Checkpoint saves and the training step: blocking writes against background writes, on slow and on local storage.

    .venv/bin/python bench/checkpoint_io.py           # about a minute on 2 cores
    .venv/bin/python bench/checkpoint_io.py --quick   # smoke test

Every contender runs our trainer's optimizer steps (``Trainer.train_step``; the tiny-cpu preset's tiny BERT, fp32,
at sequence length 64 and a global batch of 8, on pre-collated DummyDataset micro-batches) and saves a checkpoint
every ``--every`` steps through ``Trainer.save_checkpoint``, as ``Trainer.fit`` does (half a period in: at steps
4, 12, 20 of 24, so that every repeat holds the same saves and a write in flight has steps left to overlap);
the time of a repeat runs from its first step to the end of its last write (the background writer's last write
is waited for, so no write escapes the clock):

  no saves        the steps alone
  blocking        checkpoint_in_background false: the step waits for each write
  background      checkpoint_in_background true: the state is copied to host memory, a thread writes it

each on the stand-in slow storage of bench/slow_storage.py and on this machine's local disk. The slow storage
writes a checkpoint in the time of ``--write-steps`` steps (default 3, its bandwidth set from the steps' own
time measured first, so that the comparison means the same on a fast or a slow machine: a write that takes
longer than the steps between two saves makes every writer wait for the storage), or at ``--mb-per-s``.
Targets, in median seconds per step: background <= 1.10 × no saves on slow storage (the step does not wait
for the storage); blocking >= 1.25 × background there (the ideal is (every + write-steps) / every = 1.375:
the storage is slow enough for writes to matter); background <= 1.05 × blocking on local disk (the host copy
and the thread cost nothing where writes are fast).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from gpu_common import synchronize
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
    step_time_rows,
)
from slow_storage import slow_checkpoint_storage

from distqa.checkpoint.run_folder import list_checkpoints
from distqa.distributed.runtime import local_runtime
from distqa.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=5)
    parser.add_argument("--steps", type=int, default=24, help="optimizer steps per contender and repeat")
    parser.add_argument("--every", type=int, default=8, help="a checkpoint every N steps (checkpoint_every)")
    parser.add_argument("--write-steps", type=float, default=3.0,
                        help="the slow storage writes a checkpoint in the time of this many steps")
    parser.add_argument("--mb-per-s", type=float, default=0.0,
                        help="bandwidth of the slow storage instead (default 0: from --write-steps)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.every, args.write_steps = 3, 4, 2, 1.0
    pin_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-io-") as work:
        trainers = {name: a_trainer(Path(work) / name.replace(" ", "-"), background)
                    for name, background in (("no saves", False), ("blocking", False), ("background", True))}
        batches = list(itertools.islice(iter(trainers["no saves"].loader), 4 * trainers["no saves"].plan.accumulation))
        local = contextlib.nullcontext
        # The storage's bandwidth: a checkpoint (its size from one save, after a step: with AdamW's state) in the
        # time of --write-steps steps.
        trainers["blocking"].train_step(itertools.cycle(batches))
        trainers["blocking"].save_checkpoint()
        size = list_checkpoints(trainers["blocking"].run_dir)[-1].stat().st_size
        step_s = median([seconds_per_step(trainers["no saves"], batches, args.steps, 0, local) for _ in range(3)])
        mb_per_s = args.mb_per_s or size / 1e6 / (args.write_steps * step_s)
        slow = lambda: slow_checkpoint_storage(mb_per_s)  # noqa: E731

        def contender(name: str, storage: Callable[[], contextlib.AbstractContextManager[object]],
                      every: int) -> Callable[[], float]:
            return lambda: seconds_per_step(trainers[name], batches, args.steps, every, storage)

        figures = interleaved({
            "no saves": contender("no saves", local, 0),
            "blocking, slow storage": contender("blocking", slow, args.every),
            "background, slow storage": contender("background", slow, args.every),
            "blocking, local disk": contender("blocking", local, args.every),
            "background, local disk": contender("background", local, args.every),
        }, args.repeats)

    print(machine_line(args.threads))
    model = trainers["no saves"].model
    print(f"model: tiny BERT ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), fp32, "
          f"{args.steps} steps per repeat, a checkpoint every {args.every} steps ({size / 1e6:.1f} MB: model, AdamW "
          f"state, RNG); slow storage {mb_per_s:.1f} MB/s ({size / 1e6 / mb_per_s:.2f} s per checkpoint, "
          f"{size / 1e6 / mb_per_s / step_s:.1f} steps of {1000 * step_s:.0f} ms)")
    rows = step_time_rows(figures, decimals=1)
    print_table("time per optimizer step, saves and writes included (median):", rows)
    per_step = {name: median(values) for name, values in figures.items()}
    print_targets([
        Target("background / no saves, time per step, slow storage",
               per_step["background, slow storage"] / per_step["no saves"], 1.10, at_most=True),
        Target("blocking / background, time per step, slow storage",
               per_step["blocking, slow storage"] / per_step["background, slow storage"], 1.25, at_most=False),
        Target("background / blocking, time per step, local disk",
               per_step["background, local disk"] / per_step["blocking, local disk"], 1.05, at_most=True),
    ])


def a_trainer(run_dir: Path, background: bool) -> Trainer:
    config = bench_config("--dummy-size", "256", "--max-seq-len", "64", "--max-question-len", "16",
                          "--global-batch-size", "8", "--per-rank-batch-size", "8", "--keep-checkpoints", "2",
                          "--checkpoint-in-background", "true" if background else "false")
    return build_our_trainer(config, local_runtime("cpu"), dummy_dataset(config), run_dir)


def seconds_per_step(trainer: Trainer, batches: list[dict[str, torch.Tensor]], steps: int, every: int,
                     storage: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
                     ) -> float:
    """Seconds per step over ``steps`` steps with a save every ``every`` (0: none; half a period in), up to the end
    of the last write and of the device's queued work; one untimed step first lets caches and the allocator settle
    after another contender ran. bench/gpu_settings.py times the GPU's rows with it too."""
    micro_batches = itertools.cycle(batches)
    trainer.train_step(micro_batches)
    with storage():
        synchronize(trainer.runtime.device)
        started = time.perf_counter()
        for step in range(1, steps + 1):
            trainer.train_step(micro_batches)
            trainer.progress.step += 1
            if every and step % every == every // 2:
                trainer.save_checkpoint()
        trainer.checkpoints.wait()
        synchronize(trainer.runtime.device)
        return (time.perf_counter() - started) / steps


if __name__ == "__main__":
    main()
