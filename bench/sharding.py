"""Full sharding (``--data-parallel fsdp``, distqa.distributed.fsdp) against DDP on CPU: memory per rank, step time,
saves.

    .venv/bin/python bench/sharding.py           # about 4 minutes on 2 cores
    .venv/bin/python bench/sharding.py --quick   # smoke test (tiny model, figures meaningless)

The model: the QA task's BERT from data/tiny-bert's tokenizer with a wider config written to a temporary directory
(hidden 256, 6 layers, 4 heads, FFN 1024: 5.2 M parameters; --quick: hidden 64, 2 layers), random weights, fp32,
on pre-collated DummyDataset batches of max_seq_len 128. Each rank runs one torch thread, gloo on loopback.

(a) memory per rank, at 1, 2 and 4 ranks (1 rank in this process; 2 and 4 under ``torchrun --standalone``, the
    2-rank launch measuring (b) and (c) after it): the
    model built, wrapped as distqa.train wraps it (``distqa.distributed.fsdp.data_parallel_model``: DDP's wrap, or
    ``shard_model`` per transformer layer then the root; at 1 rank both are the bare model), AdamW, one step,
    then a second forward, backward and optimizer step with the gradients kept. Counted: the bytes of the
    parameters, their gradients and AdamW's state as this rank holds them (``DTensor.to_local()`` for shards).
    Measured: torch's profiler memory events (as tests/qa/test_memory.py measures CPU peaks), everything built inside
    it: the bytes still live at the end (which must be the counted state, to 5 %) and the peak over the two steps
    (the state plus activations and, for fsdp, the gathered units and unsharded gradients). Target: fsdp's counted
    state ≤ 1.1 / W of DDP's at W ranks.
(b) step time on 2 ranks, ddp and fsdp side by side (interleaved repeats of
    ``distqa.training.trainer.Trainer.train_step``, per-rank batch 4 × 2 micro-batches, the slower rank's time):
    fsdp / ddp, target ≤ 1.3.
(c) save time on 2 ranks, interleaved: the single-file save of distqa's checkpoints (``full_model_state`` and
    ``full_optimizer_state`` gathered to rank 0, then ``torch.save`` by rank 0; no CRC sidecar, no background
    thread) against a sharded one: ``torch.distributed.checkpoint.save`` of the sharded state dicts, each rank
    writing its own shards. This calls ``dcp.save`` directly, the save at the heart of distqa's sharded
    checkpoints (distqa.checkpoint.sharded), without their background thread, digests and manifest. Reported, no
    target (the issue sets none).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from harness import (
    Target,
    add_common_arguments,
    bench_config,
    dummy_dataset,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    seconds_per_step,
    spread,
    step_time_rows,
)
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import Dataset

from distqa.config import Config
from distqa.distributed.fsdp import full_model_state, full_optimizer_state
from distqa.distributed.runtime import (
    Runtime,
    all_gather_objects,
    all_reduce_max,
    barrier,
    broadcast_object,
    distributed_runtime,
    local_runtime,
)
from distqa.tasks import make_task
from distqa.train import build_trainer
from distqa.training.trainer import Trainer

STATE_TARGET = 1.1
"""fsdp's parameters + gradients + AdamW state per rank ≤ 1.1 / W of DDP's (issue 33 part 7)."""
TIME_TARGET = 1.3
WORLD_SIZES = (1, 2, 4)
PER_RANK_BATCH, ACCUMULATION, TIME_WORLD_SIZE = 4, 2, 2
WORKERS = ("memory", "memory and time")
"""What a launched worker measures: (a) alone, or (a) then (b) and (c) (at TIME_WORLD_SIZE)."""
MODEL = {"hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "intermediate_size": 1024}
QUICK_MODEL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256}
STRATEGIES = ("ddp", "fsdp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=7)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per contender and repeat")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)  # set when torchrun starts us
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 3, 1
    pin_threads(args.threads)
    if args.worker:
        with distributed_runtime("cpu") as runtime:
            figures = {"memory": memory_figures(runtime, args.model_dir)}
            if args.worker == "memory and time":
                figures["time"] = time_figures(runtime, args.model_dir, args.repeats, args.steps)
            if runtime.rank == 0:
                args.results.write_text(json.dumps(figures))
        # The group is gone and the figures written; now skip the interpreter's teardown. About one exit in five of
        # a 4-rank memory worker (the profiler run twice beside gloo's threads) aborted there ("terminate called
        # without an active exception", SIGABRT), which torchrun reports as the job failing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    with tempfile.TemporaryDirectory(prefix="bench-sharding-") as work:
        model_dir = wider_model(Path(work), QUICK_MODEL if args.quick else MODEL)
        memory = {1: memory_figures(local_runtime("cpu"), model_dir)}
        # One launch per world size (each costs every rank's start-up): (b) and (c) run in the 2-rank one, after (a).
        launched = {world_size: launch(world_size, "memory and time" if world_size == TIME_WORLD_SIZE else "memory",
                                       model_dir, Path(work), args) for world_size in WORLD_SIZES[1:]}
        memory |= {world_size: figures["memory"] for world_size, figures in launched.items()}
        timing = launched[TIME_WORLD_SIZE]["time"]
    report(memory, timing, args)


def wider_model(work: Path, shape: dict[str, int]) -> Path:
    """data/tiny-bert (its tokenizer, no weights) with the encoder's ``shape``: random weights of that size."""
    source = Path(__file__).resolve().parent.parent / "data" / "tiny-bert"
    target = work / "model"
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **shape}))
    return target


def launch(world_size: int, worker: str, model_dir: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """This script again, as ``world_size`` ranks under torchrun on loopback; rank 0's figures."""
    results = work / f"figures-{world_size}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
               __file__, "--worker", worker, "--model-dir", str(model_dir), "--results", str(results),
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--steps", str(args.steps)]
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
    subprocess.run(command, env=environment, check=True)
    return json.loads(results.read_text())


def trainer_config(strategy: str, runtime: Runtime, model_dir: Path, accumulation: int) -> Config:
    return bench_config("--model-name-or-path", str(model_dir), "--from-scratch", "true", "--dropout", "0",
                          "--data-parallel", strategy, "--per-rank-batch-size", str(PER_RANK_BATCH),
                          "--global-batch-size", str(PER_RANK_BATCH * accumulation * runtime.world_size),
                          "--dummy-size", "256")


def bench_trainer(config: Config, runtime: Runtime, dataset: Dataset, run_dir: Path) -> Trainer:
    """A Trainer over ``dataset`` as distqa.train builds it for ``config.data_parallel`` (no evaluation)."""
    return build_trainer(config, runtime, run_dir, make_task(config), dataset=dataset, evaluation=False)


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def counted_state(trainer: Trainer) -> dict[str, int]:
    """Bytes of the parameters, gradients and AdamW state this rank holds (its shards, for a sharded model)."""
    parameters = list(trainer.model.parameters())
    return {"parameters": sum(local_bytes(p) for p in parameters),
            "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
            "optimizer": sum(local_bytes(value) for state in trainer.optimizer.state.values()
                             for value in state.values() if isinstance(value, torch.Tensor))}


def memory_figures(runtime: Runtime, model_dir: Path) -> dict[str, Any]:
    """(a) at this world size: per strategy, every rank's counted state, bytes live after the steps, and peak."""
    figures: dict[str, Any] = {}
    for strategy in STRATEGIES:
        config = trainer_config(strategy, runtime, model_dir, 1)
        dataset = dummy_dataset(config)  # outside the profiler: not the state measured
        with tempfile.TemporaryDirectory(prefix=f"bench-sharding-rank{runtime.rank}-") as run_dir:
            trace = Path(run_dir) / "trace.json"
            gc.collect()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
                trainer = bench_trainer(config, runtime, dataset, Path(run_dir))
                batch = next(iter(trainer.loader))
                with record_function("steps"):
                    trainer.train_step(iter([batch]))  # creates AdamW's state; gradients set to None after
                    output = trainer.ddp_model(**{name: batch[name] for name in trainer.task.input_names})
                    trainer.task.loss(output, batch).backward()
                    trainer.optimizer.step()  # gradients kept: parameters, gradients and state all live
                    del output
                counted = counted_state(trainer)
                gc.collect()  # the collectives' finished work objects, in reference cycles, hold their buffers
            resident, peak = live_and_peak(profiler, trace)
            del trainer, batch, dataset
        figures[strategy] = all_gather_objects({**counted, "resident": resident, "peak": peak})
    return figures


def live_and_peak(profiler: profile, trace: Path) -> tuple[int, int]:
    """Bytes of CPU tensors allocated inside ``profiler`` and live at its end; their peak from the "steps" range on."""
    profiler.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    steps_start = min(e["ts"] for e in events if e.get("name") == "steps")
    live: dict[int, int] = {}
    total = peak = 0
    for event in sorted((e for e in events if e.get("name") == "[memory]"),
                        key=lambda e: (e["ts"], e["args"]["Ev Idx"])):
        size, address = event["args"]["Bytes"], event["args"]["Addr"]
        if size > 0:
            live[address] = size
            total += size
        elif address in live:  # a free of a block allocated inside the profiler (others are not ours)
            total -= live.pop(address)
        if event["ts"] >= steps_start:
            peak = max(peak, total)
    return total, peak


def time_figures(runtime: Runtime, model_dir: Path, repeats: int, steps: int) -> dict[str, Any]:
    """(b) and (c) on this world size: seconds per step and per save, per contender, the slower rank's."""
    run_dir = Path(broadcast_object(tempfile.mkdtemp(prefix="bench-sharding-saves-") if runtime.rank == 0 else None))
    try:
        configs = {strategy: trainer_config(strategy, runtime, model_dir, ACCUMULATION) for strategy in STRATEGIES}
        dataset = dummy_dataset(configs["ddp"])
        trainers = {strategy: bench_trainer(config, runtime, dataset, run_dir) for strategy, config in configs.items()}
        batches = list(itertools.islice(iter(trainers["ddp"].loader), 4 * ACCUMULATION))
        step_times = interleaved({strategy: (lambda trainer=trainer: slowest(
            lambda: seconds_per_step(trainer.train_step, batches, steps)))
            for strategy, trainer in trainers.items()}, repeats)
        sharded = trainers["fsdp"]
        sharded.train_step(itertools.cycle(batches))  # AdamW's state exists: the saves write all of it
        saves = itertools.count()
        save_times = interleaved({
            "single file (gathered to rank 0)": lambda: slowest(lambda: single_file_save(
                sharded, run_dir / f"single-{next(saves)}.pt")),
            "dcp.save (each rank its shards)": lambda: slowest(lambda: sharded_save(
                sharded, run_dir / f"dcp-{next(saves)}")),
        }, repeats)
        barrier()
        sizes = {"single file": (run_dir / "single-0.pt").stat().st_size if runtime.rank == 0 else 0,
                 "dcp": sum(f.stat().st_size for f in (run_dir / "dcp-1").iterdir()) if runtime.rank == 0 else 0}
        return {"steps": step_times, "saves": save_times, "bytes": sizes,
                "parameters": sum(p.numel() for p in trainers["ddp"].model.parameters())}
    finally:
        barrier()
        if runtime.rank == 0:
            shutil.rmtree(run_dir, ignore_errors=True)


def slowest(timed: Callable[[], float]) -> float:
    """``timed()``'s seconds on every rank at once, the slower rank's (what the job runs at)."""
    barrier()
    elapsed = timed()
    barrier()
    return all_reduce_max(round(elapsed * 1e6), torch.device("cpu")) / 1e6


def single_file_save(trainer: Trainer, path: Path) -> float:
    started = time.perf_counter()
    is_main = trainer.runtime.is_main_process
    state = {"model": full_model_state(trainer.model, is_main),
             "optimizer": full_optimizer_state(trainer.model, trainer.optimizer, is_main)}
    if is_main:
        torch.save(state, path)
    return time.perf_counter() - started


def sharded_save(trainer: Trainer, path: Path) -> float:
    started = time.perf_counter()
    dcp.save({"model": get_model_state_dict(trainer.model),
              "optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer)}, checkpoint_id=path)
    return time.perf_counter() - started


def report(memory: dict[int, dict[str, Any]], timing: dict[str, Any], args: argparse.Namespace) -> None:
    mib = 2 ** 20
    print(machine_line(args.threads, processes=TIME_WORLD_SIZE))
    print(f"model: BERT {QUICK_MODEL if args.quick else MODEL}, {timing['parameters'] / 1e6:.2f} M parameters, fp32, "
          f"AdamW; max_seq_len 128; gloo on loopback")
    print("\n(a) memory per rank (MiB): parameters + gradients + AdamW state counted from the local shards; measured "
          "by torch's profiler: live after the steps (the counted state plus the batch, shards' padding and, on some "
          "ranks, gloo's copy of a reduce-scatter input or a prefetched all-gather whose free the profiler missed), "
          "and the peak over the steps (the state plus activations and, for fsdp, gathered units)")
    rows, targets = [], []
    for world_size in WORLD_SIZES:
        counted, peak = {}, {}
        for strategy in STRATEGIES:
            ranks = memory[world_size][strategy]
            states = [r["parameters"] + r["gradients"] + r["optimizer"] for r in ranks]
            counted[strategy], peak[strategy] = max(states), max(r["peak"] for r in ranks)
            extra = [r["resident"] - state for r, state in zip(ranks, states, strict=True)]
            rows.append((f"{strategy}, {world_size} rank(s)", f"{counted[strategy] / mib:8.2f} counted",
                         f"live after: counted + {min(extra) / mib:.2f}..{max(extra) / mib:.2f}; "
                         f"peak {peak[strategy] / mib:8.2f} (largest rank)"))
        ratio = counted["fsdp"] / counted["ddp"]
        if world_size > 1:
            saved = (peak["ddp"] - peak["fsdp"]) / (counted["ddp"] - counted["fsdp"])
            print(f"  {world_size} ranks: fsdp / ddp counted {ratio:.3f} (1 / W = {1 / world_size:.3f}); the measured "
                  f"peak falls by {saved:.2f} × the counted saving")
            targets.append(Target(f"fsdp / ddp state per rank at {world_size} ranks, x W", ratio * world_size,
                                  STATE_TARGET, at_most=True))
    print_table("", rows)
    print(f"\n(b) time per optimizer step, {TIME_WORLD_SIZE} ranks, per-rank batch {PER_RANK_BATCH} × {ACCUMULATION} "
          f"micro-batches, {args.steps} steps per repeat (slower rank):")
    print_table("", step_time_rows(timing["steps"]))
    print(f"\n(c) save time, {TIME_WORLD_SIZE} ranks, the fsdp model and its AdamW state (slower rank; "
          f"single file {timing['bytes']['single file'] / mib:.1f} MiB, dcp {timing['bytes']['dcp'] / mib:.1f} MiB):")
    print_table("", [(name, f"{1000 * median(values):.1f} ms", spread([1000 * v for v in values]))
                     for name, values in timing["saves"].items()])
    single, sharded = (median(values) for values in timing["saves"].values())
    print(f"  dcp.save / single file: {sharded / single:.3f} (reported; no target)")
    print_targets([*targets, Target("fsdp / ddp (2 gloo ranks), time per step", median(timing["steps"]["fsdp"])
                          / median(timing["steps"]["ddp"]), TIME_TARGET, at_most=True)])


if __name__ == "__main__":
    main()
