"""What limits the MFU of our BERT-base step on one GPU, and what each attempt to raise it gives (issue 35).

    python3 bench/gpu_mfu.py --json DIR/mfu.json              # one GPU: one compile per attempt (minutes)
    .venv/bin/python bench/gpu_mfu.py --device cpu --quick    # smoke run: tiny BERT on CPU, figures meaningless

BERT of bert-base-uncased's sizes with random weights (bench/gpu_common.py), seq 512, bf16, DummyDataset windows
padded to the sequence length, ``--batch-size`` windows per optimizer step (the presets' 32), one process. Each
attempt is measured as bench/gpu_bert.py measures "ours" (its ``measure_ours``: warm-up, then the median of
``--repeats`` × ``--steps`` optimizer steps), each in a process of its own (on an H100, CUDA graphs gave 334
samples/s after three other compiled attempts in one process and 680 alone: what ran before must not count):

  eager                          bf16 autocast, no compile
  eager, bf16 weights            the weights cast to bf16 and no autocast (below), not compiled
  compiled                       ``--compile true``: what distqa.train runs on GPUs
  compiled, CUDA graphs          ``--compile-mode reduce-overhead``: the step's kernels replayed as CUDA graphs
  compiled, bf16 weights         the weights cast to bf16 and no autocast: what removing autocast's cast of every
                                 weight before every matrix product can give at most (an upper bound, not a way
                                 to train: there is no fp32 master copy, so small updates are lost)
  compiled, CUDA graphs, bf16 weights
  compiled, micro-batch 2 ×      the same step on twice the windows: what a larger micro-batch gives
  compiled, CUDA graphs, micro-batch 2 ×

Then a ``torch.profiler`` trace of ``--profile-steps`` steps of each ``--profile`` attempt (default: compiled,
with and without CUDA graphs) says where its time goes, with the graphs compiled and the graph breaks:
wall and GPU-busy time per step (a GPU busy far less than the wall time waits for the host), GPU time by kind
of kernel (matrix products, attention, fused elementwise kernels, copies and casts, the optimizer, other),
the FLOP rate inside the matrix-product and attention kernels, and the top kernels.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from gpu_bert import Contender, CountedBatches, Row, measure_ours
from gpu_common import (
    add_device_arguments,
    device_name,
    first_line,
    model_flags,
    model_name,
    peak_memory_gib,
    reset_peak_memory,
    start_training_part,
    synchronize,
    write_part,
)
from harness import add_common_arguments, bench_config, build_our_trainer, dummy_dataset, endless
from torch._dynamo.utils import counters
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from distqa.distributed.precision import Precision
from distqa.distributed.runtime import local_runtime
from distqa.encoders.pretrained import load_encoder_config
from distqa.qa.config import QAConfig
from distqa.record.throughput import peak_bf16_flops
from distqa.training.trainer import Trainer

SEQ_LEN = 512
MFU_GOAL = 0.45


def bf16_weights(trainer: Trainer) -> None:
    """The model's parameters and buffers cast to bf16 and autocast off: no per-matmul weight casts."""
    trainer.model.to(torch.bfloat16)
    trainer.precision = Precision(dtype=None, device_type=trainer.runtime.device.type,
                                  scaler=torch.amp.GradScaler(trainer.runtime.device.type, enabled=False))


@dataclass(frozen=True)
class Attempt:
    name: str
    flags: tuple[str, ...] = ()
    """distqa.train flags on top of the baseline's (bf16, seq 512, the micro-batch)."""
    batch_scale: int = 1
    prepare: Callable[[Trainer], None] | None = None

    @property
    def compiled(self) -> bool:
        return "--compile" in self.flags and self.flags[self.flags.index("--compile") + 1] == "true"


COMPILED = ("--compile", "true")
CUDA_GRAPHS = (*COMPILED, "--compile-mode", "reduce-overhead", "--trim-padding", "false")  # graphs need one shape
ATTEMPTS = (
    Attempt("eager", ("--compile", "false")),
    Attempt("eager, bf16 weights", ("--compile", "false"), prepare=bf16_weights),
    Attempt("compiled", COMPILED),
    Attempt("compiled, CUDA graphs", CUDA_GRAPHS),
    Attempt("compiled, bf16 weights", COMPILED, prepare=bf16_weights),
    Attempt("compiled, CUDA graphs, bf16 weights", CUDA_GRAPHS, prepare=bf16_weights),
    Attempt("compiled, micro-batch 2 ×", COMPILED, batch_scale=2),
    Attempt("compiled, CUDA graphs, micro-batch 2 ×", CUDA_GRAPHS, batch_scale=2),
)
PROFILED = ("compiled", "compiled, CUDA graphs")

KERNEL_KINDS = (  # the first pattern a kernel's name matches (lower case) gives its kind
    ("attention", r"flash|fmha|attention|sdpa"),
    ("optimizer", r"adam|multi_tensor|foreach|_amp_"),
    ("matrix products", r"gemm|cutlass|xmma|nvjet|cublas|triton_tem"),
    # Inductor names a fused kernel after what it fuses: a LayerNorm with its dropout and casts is one kernel.
    ("fused elementwise and norms (Triton)", r"^triton_"),
    ("copies and casts", r"memcpy|memset|copy|cast|convert"),
    ("collectives", r"nccl"),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, lowered)), "other")


def where_the_time_goes(trainer: Trainer, batches: CountedBatches, steps: int,
                        peak_flops: float | None) -> dict[str, Any]:
    """Profile ``steps`` optimizer steps: wall and GPU time per step, GPU time by kind of kernel, the top kernels."""
    device = trainer.runtime.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    tokens_before, flops_before = batches.tokens, batches.flops
    synchronize(device)
    with profile(activities=activities) as trace:
        started = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(batches)
        synchronize(device)
        wall_s = time.perf_counter() - started
    by_kind: Counter[str] = Counter()
    by_kernel: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for event in trace.profiler.kineto_results.events():
        if event.device_type() != DeviceType.CUDA or event.is_user_annotation():  # kernels and copies, not ranges
            continue
        seconds = event.duration_ns() / 1e9
        by_kind[kernel_kind(event.name())] += seconds
        by_kernel[event.name()] += seconds
        calls[event.name()] += 1
    gpu_s = sum(by_kind.values())
    flops = batches.flops - flops_before
    compute_s = by_kind["matrix products"] + by_kind["attention"]
    return {
        "steps": steps, "tokens_per_step": (batches.tokens - tokens_before) / steps,
        "wall_ms_per_step": 1e3 * wall_s / steps, "gpu_busy_ms_per_step": 1e3 * gpu_s / steps,
        "kernels_per_step": sum(calls.values()) / steps,
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs_compiled": counters["stats"]["unique_graphs"],
        "ms_per_step_by_kind": {kind: 1e3 * seconds / steps for kind, seconds in by_kind.most_common()},
        # The model's FLOPs over the time of the kernels that do them: how well the matrix products themselves run.
        "tflops_in_matmul_and_attention": flops / compute_s / 1e12 if compute_s else None,
        "mfu_if_only_matmul_and_attention_ran": flops / compute_s / peak_flops if compute_s and peak_flops else None,
        "top_kernels": [{"name": name[:120], "kind": kernel_kind(name), "ms_per_step": 1e3 * seconds / steps,
                         "calls_per_step": calls[name] / steps} for name, seconds in by_kernel.most_common(15)],
    }


def attempt_config(attempt: Attempt, flags: list[str], device: torch.device, batch_size: int, seq_len: int) -> QAConfig:
    """The settings of ``attempt``: bf16 at ``seq_len``, one micro-batch of ``batch_size`` × the attempt's scale."""
    batch_size *= attempt.batch_scale
    return bench_config(
        *flags, "--device", device.type, "--precision", "bf16", "--max-seq-len", str(seq_len),
        "--max-question-len", "32", "--per-rank-batch-size", str(batch_size), "--global-batch-size", str(batch_size),
        "--dummy-size", str(max(64 * batch_size, 256)), "--warmup-steps", "10",
        "--num-workers", "4" if device.type == "cuda" else "0", *attempt.flags)


def profile_attempt(attempt: Attempt, flags: list[str], device: torch.device, args: argparse.Namespace, seq_len: int,
                    work: Path, peak_flops: float | None) -> dict[str, Any]:
    """Build ``attempt``'s trainer, warm it up and profile it (:func:`where_the_time_goes`); a failure is a note."""
    print(f"profile of {attempt.name} …", flush=True)
    try:
        config = attempt_config(attempt, flags, device, args.batch_size, seq_len)
        trainer = build_our_trainer(config, local_runtime(device.type), dummy_dataset(config), work)
        if attempt.prepare is not None:
            attempt.prepare(trainer)
        batches = CountedBatches(endless(trainer.loader), load_encoder_config(config))
        counters.clear()
        for _ in range(args.warmup):
            trainer.train_step(batches)
        return where_the_time_goes(trainer, batches, args.profile_steps, peak_flops) | {"attempt": attempt.name}
    except Exception as err:
        return {"attempt": attempt.name, "note": f"FAILED: {first_line(err)}"}
    finally:
        gc.collect()
        torch.compiler.reset()


def unmeasured_row(attempt: Attempt, seq_len: int, batch_size: int, note: str) -> dict[str, Any]:
    """The row of an attempt with no figures, ``note`` saying why (n/a, or ``FAILED: …``)."""
    row = Row(attempt.name, "ours", "bf16", attempt.compiled, seq_len, note=note)
    return vars(row) | {"micro_batch": batch_size * attempt.batch_scale}


def measure_attempt(attempt: Attempt, flags: list[str], device: torch.device, args: argparse.Namespace, seq_len: int,
                    work: Path, peak_flops: float | None) -> dict[str, Any]:
    """``attempt``'s row (its ``FAILED: …`` note where it failed: a compile error, out of memory)."""
    batch_size = args.batch_size * attempt.batch_scale
    contender = Contender("ours", "bf16", attempt.compiled, seq_len)
    print(f"{attempt.name}, micro-batch {batch_size} …", flush=True)
    reset_peak_memory(device)
    try:
        config = attempt_config(attempt, flags, device, args.batch_size, seq_len)
        row = measure_ours(contender, config, device, args, work, peak_flops, attempt.prepare)
    except Exception as err:
        return unmeasured_row(attempt, seq_len, args.batch_size, f"FAILED: {first_line(err)}")
    row.name = attempt.name
    if row.samples_per_s is not None:
        row.peak_memory_gib = peak_memory_gib(device)
    return vars(row) | {"micro_batch": batch_size}


def in_a_process_of_its_own(attempt: Attempt, profiled: bool, work: Path, seq_len: int, batch_size: int
                            ) -> dict[str, Any]:
    """This script again, for ``attempt`` alone (and its profile where ``profiled``): its row and profile. A process
    that ends without them (killed, a crash in a kernel) gives a row saying so."""
    results = work / "attempt.json"
    results.unlink(missing_ok=True)
    command = [sys.executable, __file__, *sys.argv[1:], "--attempt", attempt.name, "--json", str(results),
               *(["--profile", attempt.name] if profiled else ["--profile"])]
    ended = subprocess.run(command, check=False)
    if results.is_file():
        return json.loads(results.read_text())
    note = f"FAILED: its process ended with exit code {ended.returncode} and no figures (its log is above)"
    return {"row": unmeasured_row(attempt, seq_len, batch_size, note),
            "profile": {"attempt": attempt.name, "note": note} if profiled else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    add_device_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per optimizer step (one micro-batch)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps of each profiled attempt")
    parser.add_argument("--profile", nargs="*", default=list(PROFILED), metavar="NAME",
                        help="the attempts to profile, by name")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="only these attempts, by name")
    parser.add_argument("--attempt", help=argparse.SUPPRESS)  # set when this script runs one attempt on its own
    args = parser.parse_args()
    seq_len = SEQ_LEN
    if args.quick:
        args.repeats, args.steps, args.warmup, args.batch_size, args.profile_steps = 1, 1, 1, 2, 1
        seq_len = 64 if args.device == "cpu" else SEQ_LEN
    device = start_training_part(args)
    peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None
    # No inductor compile in a smoke run on CPU: the compiled attempts get a row saying so, and only the eager
    # attempt is profiled there.
    no_compile = args.quick and device.type != "cuda"
    profiled = [ATTEMPTS[0].name] if no_compile else args.profile

    if args.attempt:  # one attempt, in the process in_a_process_of_its_own started
        [attempt] = [attempt for attempt in ATTEMPTS if attempt.name == args.attempt]
        with model_flags(model_name(args)) as flags, tempfile.TemporaryDirectory(prefix="bench-gpu-mfu-") as work:
            row = measure_attempt(attempt, flags, device, args, seq_len, Path(work), peak_flops)
            gc.collect()
            torch.compiler.reset()
            profile = profile_attempt(attempt, flags, device, args, seq_len, Path(work), peak_flops) \
                if attempt.name in profiled else None
        args.json.write_text(json.dumps({"row": row, "profile": profile}))
        return

    rows, profiles = [], []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-mfu-") as work:
        for attempt in ATTEMPTS:
            if args.only and attempt.name not in args.only:
                continue
            if no_compile and attempt.compiled:
                rows.append(unmeasured_row(attempt, seq_len, args.batch_size,
                                           "n/a (--quick on CPU: no inductor compile)"))
                continue
            measured = in_a_process_of_its_own(attempt, attempt.name in profiled, Path(work), seq_len, args.batch_size)
            rows.append(measured["row"])
            if measured["profile"] is not None:
                profiles.append(measured["profile"])
    failed = any(row["note"] and row["note"].startswith("FAILED") for row in rows) \
        or any("note" in entry for entry in profiles)
    write_part(args.json, "mfu", device, model=model_name(args), seq_len=seq_len, batch_size=args.batch_size,
               steps=args.steps, repeats=args.repeats, warmup=args.warmup, peak_flops=peak_flops, rows=rows,
               profiles=profiles)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
