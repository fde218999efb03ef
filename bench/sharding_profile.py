"""Where full sharding's extra step time goes on 2 CPU ranks, and what the last unit's re-gather would cost.

    .venv/bin/python bench/sharding_profile.py           # about 3 minutes on 2 cores
    .venv/bin/python bench/sharding_profile.py --quick   # smoke run (tiny model, figures meaningless)

bench/sharding.py's model, batches and trainers (BERT of hidden 256, 6 layers, fp32, per-rank batch 4 × 2 micro-batches,
gloo on loopback, one torch thread per rank). Three contenders, interleaved repeats, the slower rank's seconds per step:

  ddp              distqa.train's DDP wrap
  fsdp             distqa.distributed.fsdp.shard_model as it is: the last layer kept gathered from its forward to its
                   backward, which begins right after it (one all-gather fewer per micro-batch)
  fsdp, all resharded  the same with every layer resharded after its forward (``set_reshard_after_forward(True)``
                   on the last unit too), as shard_model did before

Then one step of each under torch's profiler on rank 0: the self CPU time of the step's parts, summed by what FSDP2
and DDP name them (``FSDP::all_gather``, ``FSDP::post_backward_reduce``, gloo's collectives, ``aten::`` compute), so
that the table shows where fsdp's extra time goes against ddp's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness import add_common_arguments, dummy_dataset, interleaved, median, pin_threads, seconds_per_step
from sharding import ACCUMULATION, MODEL, QUICK_MODEL, bench_trainer, slowest, trainer_config, wider_model
from torch.distributed.fsdp import FSDPModule
from torch.profiler import ProfilerActivity, profile

from distqa.distributed.runtime import Runtime, distributed_runtime
from distqa.training.trainer import Trainer

CONTENDERS = ("ddp", "fsdp", "fsdp, all resharded")
PARTS = (  # (part, pattern of a profiler event's name), first match wins
    ("FSDP all-gather (and its copy-in/out)", r"FSDP::all_gather|all_gather_into_tensor|_allgather_base"),
    ("FSDP reduce-scatter", r"FSDP::post_backward_reduce|reduce_scatter"),
    ("DDP all-reduce", r"allreduce|all_reduce"),
    ("FSDP other hooks (pre/post forward, reshard)", r"^FSDP::"),
    ("optimizer step", r"Optimizer\.step|_multi_tensor_adamw|_fused_adamw|aten::_foreach"),
    ("compute (aten ops)", r"^aten::"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=7)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per contender and repeat")
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)  # set when torchrun starts us
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 1
    pin_threads(args.threads)
    if args.model_dir:
        with distributed_runtime("cpu") as runtime:
            figures = measure(runtime, args)
            if runtime.rank == 0:
                args.results.write_text(json.dumps(figures))
        return
    with tempfile.TemporaryDirectory(prefix="bench-sharding-profile-") as work:
        model_dir = wider_model(Path(work), QUICK_MODEL if args.quick else MODEL)
        results = Path(work) / "figures.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
                        "--model-dir", str(model_dir), "--results", str(results), "--threads", str(args.threads),
                        "--repeats", str(args.repeats), "--steps", str(args.steps)],
                       env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, check=True)
        report(json.loads(results.read_text()), args)


def measure(runtime: Runtime, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-sharding-profile-{runtime.rank}-") as run_dir:
        configs = {name: trainer_config(name.split(",")[0], runtime, args.model_dir, ACCUMULATION)
                   for name in CONTENDERS}
        dataset = dummy_dataset(configs["ddp"])
        trainers = {name: bench_trainer(config, runtime, dataset, Path(run_dir)) for name, config in configs.items()}
        resharded = trainers["fsdp, all resharded"].model
        last_unit = [module for module in resharded.modules() if isinstance(module, FSDPModule)][-1]
        last_unit.set_reshard_after_forward(True, recurse=False)  # the root comes first in modules(): this is a layer
        batches = list(itertools.islice(iter(trainers["ddp"].loader), 4 * ACCUMULATION))
        times = interleaved({name: (lambda trainer=trainer: slowest(
            lambda: seconds_per_step(trainer.train_step, batches, args.steps))) for name, trainer in trainers.items()},
            args.repeats)
        return {"seconds_per_step": times, "profile": {name: profiled_parts(trainer, batches)
                                                        for name, trainer in trainers.items()}}


def profiled_parts(trainer: Trainer, batches: list[Any]) -> dict[str, float]:
    """Milliseconds of self CPU time of one step, by part (PARTS; the rest under 'other')."""
    micro_batches = itertools.cycle(batches)
    trainer.train_step(micro_batches)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        trainer.train_step(micro_batches)
    parts: dict[str, float] = defaultdict(float)
    for event in profiler.key_averages():
        part = next((name for name, pattern in PARTS if re.search(pattern, event.key)), "other")
        parts[part] += event.self_cpu_time_total / 1000
    return dict(parts)


def report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    times = {name: median(values) for name, values in figures["seconds_per_step"].items()}
    print(f"seconds per step on 2 gloo ranks, median of {args.repeats} interleaved repeats of {args.steps} steps:")
    for name in CONTENDERS:
        print(f"  {name:20} {1000 * times[name]:8.1f} ms   / ddp {times[name] / times['ddp']:.3f}")
    print("\none step under the profiler on rank 0, self CPU ms by part:")
    profiles = figures["profile"]
    names = [name for name, _ in PARTS] + ["other"]
    print(f"  {'part':46}" + "".join(f"{name:>22}" for name in CONTENDERS))
    for part in names:
        print(f"  {part:46}" + "".join(f"{profiles[name].get(part, 0.0):22.1f}" for name in CONTENDERS))
    print(f"  {'total':46}" + "".join(f"{sum(profiles[name].values()):22.1f}" for name in CONTENDERS))


if __name__ == "__main__":
    main()
