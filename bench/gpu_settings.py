"""The DDP step's settings on the GPUs present, each changed alone, and checkpoint writes under the real step.

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node N bench/gpu_settings.py --json settings.json
    bench/gpu.sh --parts settings                       # the same, N = the GPUs torch sees
    bench/gpu.sh --device cpu --quick --parts settings  # smoke run: 1 process, gloo, the tiny model

Model: BERT of bert-base-uncased's sizes with random weights (bench/gpu_common.py), our QA heads and loss, seq 512
(DummyDataset windows padded to it), the presets' micro-batch 32 per GPU, bf16, not compiled (a compile per row
would take most of a short lease, and each setting acts outside the compiled graph), torch's
DistributedDataParallel even on one GPU (NCCL then runs its all-reduce over one rank), the batches from the
training loader (``distqa.train.build_loader``, 4 workers), each row timed as bench/gpu_sharding.py times it:

  ddp                  the defaults: pinned host memory, no gradient compression, one copy per gradient
  pin_memory off       the loader's batches in pageable memory (the host-to-GPU copy is then synchronous)
  batched_grad_copy    DDP copies and divides the gradients per bucket, not per parameter (torch 2.12 and later;
                       the row says so on an older torch)
  bf16 comm hook       ``--ddp-comm-hook bf16``: the buckets cast to bf16 for the all-reduce and back
  save_on_peer_loss off  no wait for the collectives before each update (distqa.distributed.nccl_errors), which the
                       defaults make so that a survivor of a lost peer can save its last step; the part also
                       records the NCCL error handling the runtime set and whether NCCL reports its error state

Then the checkpoint writes: the same DDP step with a checkpoint every ``--every`` steps (``Trainer.save_checkpoint``,
as ``Trainer.fit`` saves: model, AdamW state, RNG) on this machine's disk, written by the step itself
(``checkpoint_in_background false``) or copied to host memory and written by a thread (``true``, the default),
against no saves; seconds per step up to the end of the last write, interleaved repeats (bench/checkpoint_io.py
measures the same on CPU, with slow storage).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import itertools
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from checkpoint_io import seconds_per_step
from gpu_common import (
    add_device_arguments,
    device_name,
    first_line,
    model_flags,
    model_name,
    start_training_part,
    write_part,
)
from gpu_sharding import gpu_trainer, measure, runtime_with_a_group
from harness import add_common_arguments, bench_config, interleaved, median
from torch.nn.parallel import DistributedDataParallel

from distqa.checkpoint.run_folder import list_checkpoints
from distqa.config import Config
from distqa.distributed.nccl_errors import ERROR_HANDLING_VARIABLE, reported_error
from distqa.distributed.runtime import Runtime
from distqa.record.throughput import peak_bf16_flops
from distqa.training.trainer import Trainer

SEQ_LEN, QUICK_SEQ_LEN = 512, 64
MICRO_BATCH, QUICK_MICRO_BATCH = 32, 2
BATCHED_GRAD_COPY = "batched_grad_copy" in inspect.signature(DistributedDataParallel.__init__).parameters
SETTINGS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "ddp": ((), {}),
    "pin_memory off": ((), {"pin_memory": False}),
    "batched_grad_copy": ((), {"batched_grad_copy": True}),
    "bf16 comm hook": (("--ddp-comm-hook", "bf16"), {}),
    "save_on_peer_loss off": (("--save-on-peer-loss", "false"), {}),
}
"""Each row's flags of distqa.train and its options of gpu_sharding.gpu_trainer."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    add_device_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--every", type=int, default=20, help="a checkpoint every N steps in the checkpoint rows")
    args = parser.parse_args()
    tiny = args.device == "cpu"
    if args.quick:
        args.repeats, args.steps, args.warmup, args.every = 1, 1, 1, 2
    start_training_part(args)
    with runtime_with_a_group(args.device) as runtime:
        device = runtime.device
        peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None
        seq_len, micro_batch = (QUICK_SEQ_LEN, QUICK_MICRO_BATCH) if tiny else (SEQ_LEN, MICRO_BATCH)
        rows, failed = [], False
        with tempfile.TemporaryDirectory(prefix=f"bench-gpu-settings-{runtime.rank}-") as work, \
                model_flags(model_name(args)) as flags:
            def config(*extra: str) -> Config:
                return bench_config(
                    *flags, "--device", device.type, "--precision", "bf16", "--compile", "false",
                    "--max-seq-len", str(seq_len), "--max-question-len", "16" if tiny else "64",
                    "--per-rank-batch-size", str(micro_batch),
                    "--global-batch-size", str(micro_batch * runtime.world_size),
                    "--dummy-size", str(max(64 * micro_batch * runtime.world_size, 256)), "--warmup-steps", "10",
                    "--num-workers", "4" if device.type == "cuda" else "0", "--keep-checkpoints", "2", *extra)

            for name, (extra, options) in SETTINGS.items():
                if "batched_grad_copy" in options and not BATCHED_GRAD_COPY:
                    rows.append({"setting": name, "samples_per_s": None, "tokens_per_s": None, "mfu": None,
                                 "peak_memory_gib": None, "repeats": [],
                                 "note": f"n/a: torch {torch.__version__}'s DDP has no batched_grad_copy"})
                    continue
                row = measure(name, config(*extra), runtime, args, Path(work) / name.replace(" ", "-"), peak_flops,
                              **options)
                row["setting"] = row.pop("strategy")
                failed |= row["note"].startswith("FAILED")
                rows.append(row)
            checkpoints = measure_checkpoints(config, runtime, args, Path(work))
            peer_loss = peer_loss_handler(runtime)
            failed |= "FAILED" in checkpoints["note"]
        if runtime.rank == 0:
            write_part(args.json, "settings", device, model=model_name(args),
                       world_size=runtime.world_size, seq_len=seq_len, micro_batch=micro_batch, steps=args.steps,
                       repeats=args.repeats, warmup=args.warmup, compiled=False, peak_flops=peak_flops, rows=rows,
                       checkpoints=checkpoints, peer_loss=peer_loss)
    if failed:
        raise SystemExit(1)


def peer_loss_handler(runtime: Runtime) -> dict[str, Any]:
    """What a survivor of a lost peer relies on under NCCL: the watchdog's error handling (2, CleanUpOnly, set by
    distqa.distributed.nccl_errors.survive_nccl_errors) and the error state NCCL reports (None: not reported)."""
    return {"error_handling": os.environ.get(ERROR_HANDLING_VARIABLE),
            "reported_error": reported_error() if runtime.backend == "nccl" else None, "backend": runtime.backend}


def measure_checkpoints(config: Callable[..., Config], runtime: Runtime, args: argparse.Namespace,
                        work: Path) -> dict[str, Any]:
    """Seconds per step with no saves, blocking saves and background saves (every ``args.every`` steps, up to the
    end of the last write), the checkpoint's size, and each writer's median; a failure in the note."""
    result: dict[str, Any] = {"every": args.every, "steps": 2 * args.every, "checkpoint_mb": None,
                              "seconds_per_step": {}, "note": ""}
    trainers: dict[str, Trainer] = {}
    try:
        for name, background in (("no saves", True), ("blocking", False), ("background", True)):
            trainers[name] = gpu_trainer(
                config("--checkpoint-in-background", "true" if background else "false"), runtime,
                work / f"checkpoints-{name.replace(' ', '-')}")
        first = trainers["no saves"]
        batches = list(itertools.islice(iter(first.loader), 4 * first.plan.accumulation))
        for trainer in trainers.values():  # warm-up: the allocator, cuDNN's plans, the writer's first file
            for _ in range(args.warmup):
                trainer.train_step(itertools.cycle(batches))
        trainers["blocking"].save_checkpoint()
        result["checkpoint_mb"] = list_checkpoints(trainers["blocking"].run_dir)[-1].stat().st_size / 1e6
        try:  # a writer that fails spoils only its own figure
            trainers["background"].save_checkpoint()
            trainers["background"].checkpoints.wait()
        except Exception as err:
            traceback.print_exc()
            result["note"] = f"background: FAILED: {first_line(err)}"
            del trainers["background"]
        figures = interleaved({name: (lambda trainer=trainer, every=0 if name == "no saves" else args.every:
                                      seconds_per_step(trainer, batches, 2 * args.every, every))
                               for name, trainer in trainers.items()}, max(args.repeats, 2))
        result["seconds_per_step"] = {name: median(values) for name, values in figures.items()}
        result["repeats"] = figures
    except Exception as err:  # the rows above stand; the traceback goes to the part's log
        traceback.print_exc()
        result["note"] = f"FAILED: {first_line(err)}"
    finally:
        trainers.clear()
        gc.collect()
        if runtime.device.type == "cuda":
            torch.cuda.empty_cache()
    return result


if __name__ == "__main__":
    main()
