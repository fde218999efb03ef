"""BERT-large on the GPUs present, DDP against full sharding (FSDP2): samples/s, MFU and peak memory per GPU.

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node N bench/gpu_sharding.py --json sharding.json
    bench/gpu.sh --parts sharding                       # the same, N = the GPUs torch sees
    bench/gpu.sh --device cpu --quick --parts sharding  # smoke run: 1 process, gloo, BERT-large at tiny sizes

Model: BERT-large at its published sizes with random weights (bench/gpu_common.py), our QA heads and loss, seq 512
(DummyDataset windows padded to it), micro-batch 8 per GPU, bf16, not compiled (the same eager step in both rows: a
compile of each sharding unit against one of the DDP module would add the compilers' differences to the wrap's).
Rows: ``ddp`` (``distqa.distributed.ddp.wrap_ddp``: torch's DistributedDataParallel even on one GPU) and ``fsdp``
(``distqa.distributed.fsdp.shard_model``: each transformer layer, then the root, bf16 weights gathered, fp32
reductions), each ``Trainer.train_step`` timed as bench/gpu_bert.py times it (warm-up, then ``--repeats`` × ``--steps``
steps); samples/s of the whole job, MFU per GPU, and the peak of ``torch.cuda.max_memory_allocated`` on the fullest GPU.

On one GPU full sharding is pointless (one shard holds everything): the fsdp row then measures only what the wrap
costs (its hooks, the copies into and out of the flat gather buffers, the bf16 casts), and its memory the same
state as DDP's plus those buffers. The sharding saves memory from 2 GPUs on (1 / W of the weights, gradients and
AdamW state: bench/sharding.py counts it on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gpu_bert import CountedBatches, timed_steps
from gpu_common import (
    device_name,
    first_line,
    model_flags,
    reset_peak_memory,
    start_training_part,
    write_part,
)
from harness import add_common_arguments, bench_config, dummy_dataset, endless, median
from torch import nn

from distqa.config import Config
from distqa.distributed.ddp import wrap_ddp
from distqa.distributed.fsdp import shard_model
from distqa.distributed.nccl_errors import survive_nccl_errors
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime, all_reduce_max, distributed_runtime, join_process_group
from distqa.encoders.pretrained import load_encoder_config
from distqa.record.throughput import mfu, peak_bf16_flops
from distqa.tasks import make_task
from distqa.train import build_trainer
from distqa.training.trainer import Trainer

SEQ_LEN, QUICK_SEQ_LEN = 512, 64
MICRO_BATCH, QUICK_MICRO_BATCH = 8, 2
STRATEGIES = ("ddp", "fsdp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the real figures) or cpu (a smoke run with a tiny BERT-large)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here for bench/gpu_report.py")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
    tiny = args.device == "cpu"
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 1, 1
    start_training_part(args)
    with runtime_with_a_group(args.device) as runtime:
        device = runtime.device
        peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None
        seq_len, micro_batch = (QUICK_SEQ_LEN, QUICK_MICRO_BATCH) if tiny else (SEQ_LEN, MICRO_BATCH)
        rows, failed = [], False
        with tempfile.TemporaryDirectory(prefix=f"bench-gpu-sharding-{runtime.rank}-") as work, \
                model_flags("bert-large", tiny=tiny) as flags:
            for strategy in STRATEGIES:
                config = bench_config(
                    *flags, "--device", device.type, "--precision", "bf16", "--compile", "false",
                    "--data-parallel", strategy, "--max-seq-len", str(seq_len),
                    "--max-question-len", "16" if tiny else "64", "--per-rank-batch-size", str(micro_batch),
                    "--global-batch-size", str(micro_batch * runtime.world_size),
                    "--dummy-size", str(max(64 * micro_batch * runtime.world_size, 256)), "--warmup-steps", "10",
                    "--num-workers", "4" if device.type == "cuda" else "0")
                row = measure(strategy, config, runtime, args, Path(work), peak_flops)
                failed |= row["note"].startswith("FAILED")
                rows.append(row)
        if runtime.rank == 0:
            write_part(args.json, "sharding", device, model="bert-large (tiny sizes)" if tiny else "bert-large",
                       world_size=runtime.world_size, seq_len=seq_len, micro_batch=micro_batch, steps=args.steps,
                       repeats=args.repeats, warmup=args.warmup, compiled=False, peak_flops=peak_flops, rows=rows)
    if failed:
        raise SystemExit(1)


@contextlib.contextmanager
def runtime_with_a_group(device: str) -> Iterator[Runtime]:
    """distqa's runtime under torchrun, with a process group even at world size 1, where distqa.train makes none
    (it does not wrap a single process); the rows of this part and of bench/gpu_settings.py measure DDP's and
    FSDP's wraps, which need one."""
    survive_nccl_errors()  # as distqa.train does with save_on_peer_loss (the default)
    with distributed_runtime(device) as runtime:
        if not dist.is_initialized():
            join_process_group(runtime, timeout_s=600)
        yield runtime


def gpu_trainer(config: Config, runtime: Runtime, work: Path, pin_memory: bool | None = None,
                **ddp_options: Any) -> Trainer:
    """Our trainer as :func:`distqa.train.build_trainer` builds it (no evaluation), wrapped by DDP or sharded
    whatever the world size; ``pin_memory`` and ``ddp_options`` as :func:`distqa.train.build_loader` and
    :func:`distqa.distributed.ddp.wrap_ddp` take them."""
    task = make_task(config)

    def wrap(model: nn.Module, precision: Precision) -> nn.Module:
        if config.data_parallel == "ddp":
            return wrap_ddp(model, runtime, config, task.sync_buffers, **ddp_options)
        return shard_model(model, task.sharding_units(model), runtime, config, precision.dtype)

    return build_trainer(config, runtime, work, task, dataset=dummy_dataset(config), evaluation=False,
                         pin_memory=pin_memory, wrap=wrap)


def measure(strategy: str, config: Config, runtime: Runtime, args: argparse.Namespace, work: Path,
            peak_flops: float | None, **build_options: Any) -> dict[str, Any]:
    """One row: samples/s of the job, MFU per GPU, the fullest GPU's peak memory (GiB); a failure in its note.
    ``build_options`` go to :func:`gpu_trainer`."""
    row: dict[str, Any] = {"strategy": strategy, "samples_per_s": None, "tokens_per_s": None, "mfu": None,
                           "peak_memory_gib": None, "repeats": [], "note": ""}
    device = runtime.device
    reset_peak_memory(device)
    trainer = None
    try:
        trainer = gpu_trainer(config, runtime, work, **build_options)
        batches = CountedBatches(endless(trainer.loader), load_encoder_config(config))
        _, repeats = timed_steps(trainer, batches, device, args)
        # Every rank runs the same number of samples per step; the slowest rank's time is the job's.
        seconds = [all_reduce_max(round(repeat.seconds * 1e6), device) / 1e6 for repeat in repeats]
        samples = [repeat.counted["samples"] * runtime.world_size / s for repeat, s in zip(repeats, seconds,
                                                                                          strict=True)]
        row["samples_per_s"], row["repeats"] = median(samples), samples
        tokens_per_gpu = median([repeat.counted["tokens"] / s for repeat, s in zip(repeats, seconds, strict=True)])
        row["tokens_per_s"] = tokens_per_gpu * runtime.world_size
        if peak_flops is not None:
            flops_per_token = sum(r.counted["flops"] for r in repeats) / sum(r.counted["tokens"] for r in repeats)
            row["mfu"] = mfu(tokens_per_gpu, flops_per_token, peak_flops)
        if device.type == "cuda":
            row["peak_memory_gib"] = all_reduce_max(torch.cuda.max_memory_allocated(device), device) / 2**30
        if runtime.world_size == 1 and strategy == "fsdp":
            row["note"] = "1 GPU: one shard holds everything; measures only the wrap's overhead"
    except torch.OutOfMemoryError:
        row["note"] = "out of memory"
    except Exception as err:  # this row only; the other still runs
        row["note"] = f"FAILED: {first_line(err)}"
    finally:
        del trainer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


if __name__ == "__main__":
    main()
