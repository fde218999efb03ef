"""Each optimization of the training step switched off (or on) alone, against our defaults, side by side.

    .venv/bin/python bench/optimizations.py           # about 4 minutes on 2 cores (a minute of it compiling)
    .venv/bin/python bench/optimizations.py --quick   # smoke test in seconds: no compile, two small data sets

Model: the tiny-cpu preset (tiny BERT from data/tiny-bert's config, max_seq_len 128), per-rank batch 8,
4 micro-batches per optimizer step, one process, one torch thread. Every contender is
``distqa.training.trainer.Trainer.train_step`` fed by its own ``distqa.train.build_loader`` (so padding and loader
workers act as they do in training), built from the defaults with one setting changed:

  defaults            what ``python -m distqa.train`` does on a CPU: SDPA attention, fp32, no compile,
                      batches trimmed to their longest window, no loader workers
  eager attention     --attn-implementation eager (the reference matmul-softmax-matmul)
  bf16 autocast       --precision bf16 (the default on GPUs; on CPUs only where asked for)
  compile             --compile true (the default on GPUs); its compile time is reported apart
  padded              --trim-padding false: every batch padded to max_seq_len
  1 loader worker     --num-workers 1 (the batches come from a worker process)

on three data sets: the DummyDataset (a third of its windows are short, but a batch of 8 nearly always holds
a full one); the NQ sample's windows (data/nq-sample featurised into a temporary cache, as
bench/loader_vs_step.py does: documents of thousands of tokens, so nearly every window is full, as in
the real NQ); and short documents (synthetic NQ of 10 to 60 words, ``distqa.qa.nq.synthetic``: what
SQuAD-like data looks like, where whole batches are shorter than max_seq_len). The figure is the median
time per optimizer step over interleaved repeats; "defaults / contender" above 1 means the contender is
faster than the defaults.

What this CPU bench cannot show: pinned memory and non-blocking copies (host-to-GPU only), and the GPU
figures of attention, bf16 and compile (bench/gpu.sh, docs/PERFORMANCE.md). The DDP settings are measured by
bench/ddp_overhead.py, gradient compression by bench/comm_hook.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

from harness import (
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    endless,
    interleaved,
    machine_line,
    median,
    nq_windows,
    pin_threads,
    print_table,
    print_targets,
    short_document_windows,
    spread,
)
from torch.utils.data import Dataset

from distqa.distributed.runtime import local_runtime
from distqa.training.trainer import Trainer

CONTENDERS = {
    "defaults": (),
    "eager attention": ("--attn-implementation", "eager"),
    "bf16 autocast": ("--precision", "bf16"),
    "compile": ("--compile", "true"),
    "padded": ("--trim-padding", "false"),
    "1 loader worker": ("--num-workers", "1"),
}
MAX_SEQ_LEN = 128
"""The tiny-cpu preset's window length."""
TRIM_TARGET = 1.1
"""Trimming is on by default for what it saves on short documents (on the other data sets nearly every batch
holds a full window, so it changes nothing there: their ratio is 1 up to noise, and no target)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=7)
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per contender and repeat")
    args = parser.parse_args()
    contenders = dict(CONTENDERS)
    if args.quick:  # a smoke run: a cold compile alone takes 30 s or more, and the NQ sample adds nothing new
        args.repeats, args.steps = 2, 1
        del contenders["compile"]
    pin_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", module="torch.utils.data")

    print(machine_line(args.threads))
    targets = []
    with tempfile.TemporaryDirectory(prefix="bench-optimizations-") as work:
        # A cold compile, as on a fresh machine or image: not the on-disk cache of an earlier run.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(work) / "inductor-cache")
        data_sets = {
            "DummyDataset": ((), dummy_dataset(bench_config("--dummy-size", "256" if args.quick else "1024"))),
            **({} if args.quick else {"NQ sample windows": nq_windows(Path(work))}),
            "short documents": short_document_windows(Path(work), 200 if args.quick else 2000),
        }
        for data_name, (data_flags, dataset) in data_sets.items():
            batch = ("--global-batch-size", "8") if args.quick else ()  # --quick: one micro-batch per step
            figures, compile_seconds = measure(dataset, (*data_flags, *batch), contenders, Path(work), args.repeats,
                                               args.steps)
            defaults = median(figures["defaults"])
            rows = [(name, f"{1000 * median(values):.1f} ms/step",
                     f"defaults / this {defaults / median(values):.3f}; {spread([1000 * v for v in values])}")
                    for name, values in figures.items()]
            print()
            shape = bench_config(*batch)
            print_table(f"{data_name} ({len(dataset)} windows): median time per optimizer step (batch "
                        f"{shape.per_rank_batch_size} × {shape.accumulation_steps(1)} micro-batches, tiny BERT, "
                        f"max_seq_len {MAX_SEQ_LEN}):", rows)
            cached = " (cold cache)" if data_name == "DummyDataset" else " (with the caches the data sets above filled)"
            print(f"  compile time (the compiled contender's first step): {compile_seconds:.1f} s{cached}"
                  if "compile" in contenders else "  compile: not measured with --quick")
            lengths = [int(dataset[i]["attention_mask"].sum()) for i in range(len(dataset))]
            short = sum(n < MAX_SEQ_LEN for n in lengths) / len(lengths)
            print(f"  windows shorter than max_seq_len: {short:.0%}, mean length {sum(lengths) / len(lengths):.0f}")
            if data_name == "short documents":
                targets.append(Target(f"padded / trimmed time per step, {data_name}",
                                      median(figures["padded"]) / defaults, TRIM_TARGET, at_most=False))
    print_targets(targets)


def measure(dataset: Dataset, data_flags: tuple[str, ...], contenders: dict[str, tuple[str, ...]], work: Path,
            repeats: int, steps: int) -> tuple[dict[str, list[float]], float]:
    """Seconds per optimizer step of every contender on ``dataset`` (interleaved repeats), and the time
    the compiled contender's first step took."""
    runtime = local_runtime("cpu")
    trainers: dict[str, Trainer] = {}
    compile_seconds = 0.0
    for name, flags in contenders.items():
        config = bench_config(*data_flags, *flags)
        trainers[name] = trainer = build_our_trainer(config, runtime, dataset, work / name.replace(" ", "-"))
        started = time.perf_counter()
        trainer.train_step(endless(trainer.loader))  # compiles, starts workers, warms the allocator
        if name == "compile":
            compile_seconds = time.perf_counter() - started
    batches = {name: endless(trainer.loader) for name, trainer in trainers.items()}

    def timed(name: str) -> float:
        trainer, micro_batches = trainers[name], batches[name]
        trainer.train_step(micro_batches)  # settle after the previous contender
        started = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(micro_batches)
        return (time.perf_counter() - started) / steps

    return interleaved({name: (lambda name=name: timed(name)) for name in contenders}, repeats), compile_seconds


if __name__ == "__main__":
    main()
