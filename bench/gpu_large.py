"""The large presets' encoders on one GPU: throughput, MFU and peak memory against distqa.encoders.memory's estimate.

    .venv/bin/python bench/gpu_large.py --json large.json       # one GPU; bench/gpu.sh runs it (about 10 minutes)
    .venv/bin/python bench/gpu_large.py --eager --json large.json  # not compiled: the step the estimate counts
    .venv/bin/python bench/gpu_large.py --estimates             # the estimates alone: no GPU, models on meta only
    .venv/bin/python bench/gpu_large.py --device cpu --quick    # smoke run: tiny encoders of the three families

Models: BERT-large, RoBERTa-large and DeBERTa-v3-large at their published sizes (bench/gpu_common.py,
``LARGE_ENCODERS``) with random weights, our span and answer-type heads and loss; DeBERTa with eager attention
(transformers has no SDPA kernel for it), the others with SDPA. Rows: sequence length 512 (DummyDataset
windows padded to it), micro-batch 8 and 32, activation checkpointing off and on, compiled (``--compile
true``), bf16: our ``Trainer.train_step`` as bench/gpu_bert.py times it (warm-up steps, where the compile
happens, then the median of ``--repeats`` × ``--steps`` steps): samples/s, MFU and the peak of
``torch.cuda.max_memory_allocated`` next to distqa.encoders.memory's estimate of it for the same step (one process, no
accumulation). The estimate counts the eager step; the compiled one measured 10-13 % below it for BERT-base
(docs/PERFORMANCE.md). A row that runs out of memory says so.

``--device cpu --quick`` runs every row's code with tiny encoders of the three families (bench/gpu_common.py,
``TINY_SIZES``), uncompiled and at seq 64: a check that the script works before it meets a rented GPU, with
meaningless figures and no large model built.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_bert import Contender, measure_ours
from gpu_common import (
    LARGE_ENCODERS,
    Measured,
    device_name,
    first_line,
    model_flags,
    peak_memory_gib,
    reset_peak_memory,
    start_training_part,
    write_part,
)
from harness import add_common_arguments, bench_config

from distqa.encoders.memory import EncoderMemory, count_on_meta
from distqa.qa.config import QAConfig
from distqa.qa.model import build_model
from distqa.record.throughput import peak_bf16_flops
from distqa.tasks.step_memory import GiB, Step

SEQ_LEN, QUICK_SEQ_LEN = 512, 64
MICRO_BATCHES, QUICK_MICRO_BATCHES = (8, 32), (2, 4)


@dataclass
class LargeRow(Measured):
    """One model × micro-batch × checkpointing: the figures bench/gpu_report.py prints."""

    model: str
    micro_batch: int
    activation_checkpointing: bool
    seq_len: int
    parameters: int
    estimated_peak_gib: float
    """distqa.encoders.memory's estimate of the step's peak (eager; one process, no accumulation)."""
    estimated_moment: str


def row_config(flags: list[str], model: str, micro_batch: int, checkpointing: bool, seq_len: int,
               device: torch.device, compiled: bool) -> QAConfig:
    attention = "eager" if model.startswith("deberta") else "sdpa"
    return bench_config(
        *flags, "--device", device.type, "--precision", "bf16", "--compile", str(compiled).lower(),
        "--attn-implementation", attention, "--activation-checkpointing", str(checkpointing).lower(),
        "--max-seq-len", str(seq_len), "--max-question-len", "16" if seq_len < 128 else "64",
        "--per-rank-batch-size", str(micro_batch), "--global-batch-size", str(micro_batch),
        "--dummy-size", str(max(64 * micro_batch, 256)), "--warmup-steps", "10",
        "--num-workers", "4" if device.type == "cuda" else "0")


def estimate(config: QAConfig, device: torch.device) -> tuple[int, float, str]:
    """(parameters, estimated peak in GiB, its moment) of one step of ``config`` in one process on ``device``."""
    model = count_on_meta(lambda: build_model(config))
    memory = EncoderMemory.of_model(model, model.encoder.config, config.max_seq_len, config.attn_implementation)
    step = Step(config.per_rank_batch_size, "bf16", device.type, config.activation_checkpointing,
                gradients_persist=False)
    figure = memory.estimate(step)
    return memory.parameters, figure.peak / GiB, figure.moment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (the real figures) or cpu (a smoke run with tiny encoders of the same families)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here for bench/gpu_report.py")
    parser.add_argument("--models", nargs="+", choices=list(LARGE_ENCODERS), default=list(LARGE_ENCODERS))
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile happens here)")
    parser.add_argument("--eager", action="store_true",
                        help="not compiled on the GPU either: the step the estimate counts, and no compile time")
    parser.add_argument("--estimates", action="store_true",
                        help="print the estimate of every row's peak on a CUDA GPU and stop (no GPU needed)")
    args = parser.parse_args()
    if args.estimates:
        print_estimates(args.models)
        return
    tiny = args.device == "cpu"
    if args.quick:
        args.repeats, args.steps, args.warmup = 1, 1, 1
    device = start_training_part(args)
    peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None
    seq_len = QUICK_SEQ_LEN if tiny else SEQ_LEN
    # Compiled as the presets run on GPUs; a smoke run on CPU compiles nothing (inductor's cold start alone would
    # take minutes on two cores; tests/qa/test_optimizations.py covers the compiled path on CPU).
    compiled = device.type == "cuda" and not args.eager
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="bench-gpu-large-") as work:
        for model in args.models:
            with model_flags(model, tiny=tiny) as flags:
                for micro_batch in QUICK_MICRO_BATCHES if tiny else MICRO_BATCHES:
                    for checkpointing in (False, True):
                        config = row_config(flags, model, micro_batch, checkpointing, seq_len, device, compiled)
                        name = f"{model} (tiny sizes)" if tiny else model
                        row = LargeRow(name, micro_batch, checkpointing, seq_len, *estimate(config, device))
                        print(f"{model}, micro-batch {micro_batch}, activation checkpointing "
                              f"{'on' if checkpointing else 'off'} …", flush=True)
                        failed |= measure(row, config, device, args, Path(work), peak_flops)
                        if not compiled:
                            why = "--eager" if args.eager else "a smoke run on CPU"
                            row.note = (row.note + "; " if row.note else "") + f"not compiled ({why})"
                        rows.append(row)
    write_part(args.json, "large", device, seq_len=seq_len, steps=args.steps, repeats=args.repeats,
               warmup=args.warmup, compiled=compiled, peak_flops=peak_flops, rows=[vars(row) for row in rows])
    if failed:
        raise SystemExit(1)


def measure(row: LargeRow, config: QAConfig, device: torch.device, args: argparse.Namespace, work: Path,
            peak_flops: float | None) -> bool:
    """Fill ``row`` with the measured figures; True when the row failed for another reason than memory."""
    reset_peak_memory(device)
    try:
        measured = measure_ours(Contender("ours", "bf16", config.compile is True, row.seq_len), config, device, args,
                                work, peak_flops)
        row.samples_per_s, row.tokens_per_s, row.mfu = measured.samples_per_s, measured.tokens_per_s, measured.mfu
        row.warmup_s, row.repeats = measured.warmup_s, measured.repeats
        row.peak_memory_gib = peak_memory_gib(device)
        return False
    except torch.OutOfMemoryError:
        row.note = f"out of memory (estimated {row.estimated_peak_gib:.1f} GiB)"
        return False
    except Exception as err:  # a compile error spoils this row only
        row.note = f"FAILED: {first_line(err)}"
        return True
    finally:
        gc.collect()  # the row's model, optimizer and compiled graphs, before the next one's peak
        torch.compiler.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def print_estimates(models: list[str]) -> None:
    """The estimate of every row's peak on a CUDA GPU, from the models built on the meta device."""
    device = torch.device("cuda")
    print(f"distqa.encoders.memory's estimate of each row's peak (seq {SEQ_LEN}, bf16, compiled rows measure below it, "
          "one process):")
    for model in models:
        with model_flags(model) as flags:
            for micro_batch in MICRO_BATCHES:
                for checkpointing in (False, True):
                    config = row_config(flags, model, micro_batch, checkpointing, SEQ_LEN, device, compiled=True)
                    parameters, peak, moment = estimate(config, device)
                    print(f"  {model:<17} {parameters / 1e6:6.1f}M  micro-batch {micro_batch:>2}  checkpointing "
                          f"{'on ' if checkpointing else 'off'}  {peak:6.1f} GiB  (at the {moment})")


if __name__ == "__main__":
    main()
