"""Training throughput on one GPU: our trainer's step against the Hugging Face ``Trainer``, BERT-base.

    .venv/bin/python bench/gpu_bert.py --json gpu-bert.json     # one GPU; bench/gpu.sh runs it (minutes)
    .venv/bin/python bench/gpu_bert.py --device cpu --quick     # smoke run: tiny BERT on CPU, figures meaningless

Model: BERT of bert-base-uncased's sizes with random weights (bench/gpu_common.py), our span + answer-type
heads and loss; DummyDataset windows of the full sequence length (padded, as NQ windows of long documents
are); ``--batch-size`` windows per optimizer step (no accumulation). For each sequence length (384, 512):

  ours bf16            ``distqa.training.trainer.Trainer.train_step`` (bench/harness.py builds it as distqa.train does:
                       fused AdamW, clipping, schedule, ``Precision`` bf16 autocast) fed by ``build_loader``
  ours bf16 compile    the same with ``--compile true`` (``distqa.distributed.ddp.training_module``); its compile time
                       is the warm-up column
  ours fp16            fp16 autocast + ``GradScaler`` (``Precision.choose("fp16")``), seq 512 only; the loss
                       scale at the end shows whether steps were skipped (it halves on every overflow)
  hf bf16              ``transformers.Trainer`` as run_qa.py configures it (padded windows,
                       ``default_data_collator``, TrainingArguments defaults) with ``bf16=True``
  hf bf16 compile      the same with ``torch_compile=True``

Each contender is built, warmed up (``--warmup`` steps, where compile happens), then timed over ``--steps``
optimizer steps ``--repeats`` times (the figure is the median), and freed before the next one, so that
its peak memory (``torch.cuda.max_memory_allocated``) is its own: on a dedicated GPU machine there is no
other load for interleaving to even out. Tokens are every position the model runs on (padding included);
MFU = tokens/s × ``model_flops_per_token`` / the device's dense bf16 peak (``distqa.record.throughput``).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_common import (
    Measured,
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
from harness import add_common_arguments, bench_config, build_our_trainer, dummy_dataset, endless, median
from hf_trainer import hf_samples_per_s
from transformers import PretrainedConfig

from distqa.distributed.runtime import local_runtime
from distqa.encoders.flops import model_flops_per_token
from distqa.encoders.pretrained import load_encoder_config
from distqa.qa.config import QAConfig
from distqa.qa.model import QAModel, build_model
from distqa.record.throughput import mfu, peak_bf16_flops
from distqa.training.trainer import Trainer

SEQ_LENS = (384, 512)
FP16_SEQ_LEN = 512


@dataclass(frozen=True)
class Contender:
    framework: str
    """"ours" (distqa's Trainer.train_step) or "hf" (transformers.Trainer)."""
    precision: str
    compile: bool
    seq_len: int

    @property
    def name(self) -> str:
        return f"{self.framework} {self.precision}{' compile' if self.compile else ''}"


@dataclass
class Row(Measured):
    """One contender's figures (medians over the repeats), as bench/gpu_report.py prints them."""

    name: str
    framework: str
    precision: str
    compile: bool
    seq_len: int


def contenders(seq_lens: tuple[int, ...]) -> list[Contender]:
    listed = []
    for seq_len in seq_lens:
        listed += [Contender("ours", "bf16", False, seq_len), Contender("ours", "bf16", True, seq_len)]
        if seq_len == FP16_SEQ_LEN:
            listed.append(Contender("ours", "fp16", False, seq_len))
        listed += [Contender("hf", "bf16", False, seq_len), Contender("hf", "bf16", True, seq_len)]
    return listed


class CountedBatches(Iterator[dict[str, torch.Tensor]]):
    """Micro-batches of ``batches``, counting the positions the model runs on and their training FLOPs
    (at each batch's own length, so padding trimmed per batch is counted right)."""

    COUNTERS: tuple[str, ...] = ("samples", "tokens", "flops")
    """The attributes that count; a subclass that counts more names them too."""

    def counts(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.COUNTERS}

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], model_config: PretrainedConfig) -> None:
        self.batches, self.model_config = batches, model_config
        self.samples = self.tokens = 0
        self.flops = 0.0

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = next(self.batches)
        size, seq_len = batch["attention_mask"].shape
        self.samples += size
        self.tokens += size * seq_len
        self.flops += size * seq_len * model_flops_per_token(self.model_config, seq_len)
        return batch


@dataclass(frozen=True)
class Repeat:
    seconds: float
    counted: dict[str, float]
    """What the batches counted (:attr:`CountedBatches.COUNTERS`) in the repeat's steps."""


def timed_steps(trainer: Trainer, batches: CountedBatches, device: torch.device,
                args: argparse.Namespace) -> tuple[float, list[Repeat]]:
    """``args.warmup`` untimed steps of ``trainer`` (where compile happens), then ``args.repeats`` × ``args.steps``
    timed ones: the warm-up's seconds, and each repeat's seconds with what ``batches`` counted in it."""
    synchronize(device)
    started = time.perf_counter()
    for _ in range(args.warmup):
        trainer.train_step(batches)
    synchronize(device)
    warmup_s = time.perf_counter() - started
    repeats = []
    for _ in range(args.repeats):
        before = batches.counts()
        started = time.perf_counter()
        for _ in range(args.steps):
            trainer.train_step(batches)
        synchronize(device)
        seconds = time.perf_counter() - started
        repeats.append(Repeat(seconds, {name: value - before[name] for name, value in batches.counts().items()}))
    return warmup_s, repeats


def measure_ours(contender: Contender, config: QAConfig, device: torch.device, args: argparse.Namespace,
                 work: Path, peak_flops: float | None, prepare: Callable[[Trainer], None] | None = None) -> Row:
    """Build our trainer (as distqa.train builds it; then ``prepare`` changes it, for bench/gpu_mfu.py's attempts),
    warm it up, time ``args.repeats`` × ``args.steps`` steps."""
    row = Row(contender.name, contender.framework, contender.precision, contender.compile, contender.seq_len)
    dataset = dummy_dataset(config)
    trainer = build_our_trainer(config, local_runtime(device.type), dataset, work)  # compiled by --compile
    if prepare is not None:
        prepare(trainer)
    batches = CountedBatches(endless(trainer.loader), load_encoder_config(config))
    row.warmup_s, repeats = timed_steps(trainer, batches, device, args)
    samples = [repeat.counted["samples"] / repeat.seconds for repeat in repeats]
    row.samples_per_s, row.repeats = median(samples), samples
    row.tokens_per_s = median([repeat.counted["tokens"] / repeat.seconds for repeat in repeats])
    if peak_flops is not None:  # FLOPs per token averaged over the timed batches (their lengths may differ)
        flops_per_token = sum(r.counted["flops"] for r in repeats) / sum(r.counted["tokens"] for r in repeats)
        row.mfu = mfu(row.tokens_per_s, flops_per_token, peak_flops)
    if contender.precision == "fp16":
        steps = args.warmup + args.repeats * args.steps
        row.note = f"loss scale {trainer.precision.scaler.get_scale():g} after {steps} steps " \
                   "(starts at 65536, halves on each skipped step)"
    return row


def measure_hf(contender: Contender, config: QAConfig, device: torch.device, args: argparse.Namespace,
               work: Path, peak_flops: float | None) -> Row:
    """transformers.Trainer, run_qa.py's configuration + bf16 (+ torch_compile), one fresh run per repeat."""
    row = Row(contender.name, contender.framework, contender.precision, contender.compile, contender.seq_len)
    dataset = dummy_dataset(config)
    compile_arguments = {"torch_compile": True, "torch_compile_backend": args.compile_backend} \
        if contender.compile else {}
    started = time.perf_counter()
    samples = [hf_samples_per_s(config, dataset, work / "hf", args.steps, best=False, use_cpu=device.type == "cpu",
                                bf16=contender.precision == "bf16", **compile_arguments)
               for _ in range(args.repeats)]
    row.samples_per_s, row.repeats = median(samples), samples
    # run_qa.py pads every window to max_seq_length: each sample is seq_len positions.
    row.tokens_per_s = row.samples_per_s * contender.seq_len
    if peak_flops is not None:
        row.mfu = mfu(row.tokens_per_s, model_flops_per_token(load_encoder_config(config), contender.seq_len),
                      peak_flops)
    row.note = f"{args.repeats} runs of 1 + {args.steps} steps in {time.perf_counter() - started:.0f} s " \
               "(the first step of each, with any compile, untimed)"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    add_device_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per optimizer step (one micro-batch)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help='only these contenders, by name (e.g. "ours bf16 compile"): for a batch-size sweep')
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend of the HF Trainer's compiled contender (default: inductor on cuda; "
                             "eager on cpu, which traces without generating code: a fast smoke run). Ours compiles as "
                             "distqa.train does (--compile true: inductor)")
    args = parser.parse_args()
    args.compile_backend = args.compile_backend or ("inductor" if args.device == "cuda" else "eager")
    if args.quick:
        args.repeats, args.steps, args.warmup, args.batch_size, args.seq_lens = 1, 1, 1, 2, [FP16_SEQ_LEN]
    device = start_training_part(args)
    peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None

    rows, failed = [], False
    with model_flags(model_name(args)) as flags, tempfile.TemporaryDirectory(prefix="bench-gpu-bert-") as work:
        for contender in contenders(tuple(args.seq_lens)):
            if args.only and contender.name not in args.only:
                continue
            config = bench_config(
                *flags, "--device", device.type, "--precision", contender.precision,
                "--compile", str(contender.compile).lower(),
                "--max-seq-len", str(contender.seq_len), "--max-question-len", "64",
                "--per-rank-batch-size", str(args.batch_size), "--global-batch-size", str(args.batch_size),
                "--dummy-size", str(max(64 * args.batch_size, 256)), "--warmup-steps", "10",
                # As the bert-base preset loads on GPUs; the smoke run on CPU loads in the process.
                "--num-workers", "4" if device.type == "cuda" else "0")
            measure = measure_ours if contender.framework == "ours" else measure_hf
            print(f"{contender.name}, seq {contender.seq_len} …", flush=True)
            reset_peak_memory(device)
            try:
                if contender.precision == "fp16" and device.type != "cuda":
                    row = Row(contender.name, contender.framework, contender.precision, contender.compile,
                              contender.seq_len, note="n/a (fp16 needs a CUDA GPU: "
                              "distqa.distributed.precision.Precision.choose)")
                elif args.quick and device.type != "cuda" and contender.compile and contender.framework == "ours":
                    # A smoke run on CPU takes seconds; ours compiles with inductor, cold half a minute (HF's uses the
                    # eager backend on CPU: seconds). The CPU compile path is tests/qa/test_optimizations.py's; on a
                    # GPU, --quick still compiles.
                    row = Row(contender.name, contender.framework, contender.precision, contender.compile,
                              contender.seq_len, note="n/a (--quick on CPU: no inductor compile)")
                else:
                    row = measure(contender, config, device, args, Path(work), peak_flops)
            except Exception as err:  # one contender failing (a compile error, out of memory) spoils no other
                failed = True
                row = Row(contender.name, contender.framework, contender.precision, contender.compile,
                          contender.seq_len, note=f"FAILED: {first_line(err)}")
            if row.samples_per_s is not None:
                row.peak_memory_gib = peak_memory_gib(device)
            rows.append(row)
            gc.collect()  # the contender's model, optimizer and compiled graphs, before the next one's peak
            torch.compiler.reset()
        parameters = sum(p.numel() for p in _bare_model(flags).parameters())
    write_part(args.json, "training", device, model=model_name(args), parameters=parameters,
               batch_size=args.batch_size, steps=args.steps, repeats=args.repeats, warmup=args.warmup,
               compile_backend=args.compile_backend, peak_flops=peak_flops, rows=[vars(row) for row in rows])
    if failed:
        raise SystemExit(1)


def _bare_model(flags: list[str]) -> QAModel:
    """The QA model of ``flags`` on the meta device (no memory): for its parameter count."""
    with torch.device("meta"):
        return build_model(bench_config(*flags))


if __name__ == "__main__":
    main()
