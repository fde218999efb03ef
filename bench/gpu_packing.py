"""Useful tokens: a batch of short windows padded to max_seq_len, trimmed to its longest window, or unpadded.

    .venv/bin/python bench/gpu_packing.py --json packing.json     # one GPU; bench/gpu.sh runs it (minutes)
    .venv/bin/python bench/gpu_packing.py --device cpu --quick    # smoke run: tiny BERT on CPU, figures meaningless

Data: SQuAD-format windows of max_seq_len 384 (synthetic SQuAD articles, ``distqa.qa.squad.synthetic``, with filler
sentences of up to 60 words, featurised by the squad task's cache build as ``python -m distqa.prepare`` runs it):
about 150 real tokens a window, so most of a padded batch is padding. Model: BERT of bert-base-uncased's sizes with
random weights (bench/gpu_common.py), bf16, micro-batch 32, our trainer's step (bench/harness.py builds it as
distqa.train does), eager and compiled (``--compile true``), three contenders each:

  padded   every window at max_seq_len (``--trim-padding false``)
  trim     each batch cut to its longest window (``--trim-padding true``, the default)
  unpad    the encoder on the real tokens only (``--unpad true``: distqa.encoders.varlen, FlashAttention's varlen
           kernel; no attention dropout, which the padded contenders keep)

Each contender is built, warmed up (``--warmup`` steps, where compile happens) and timed over ``--steps`` steps
``--repeats`` times (medians), as in bench/gpu_bert.py. Columns: samples/s; computed tokens/s, the positions the
model runs on (padded and trim: every position of the batch; unpad: the real tokens); useful tokens/s (attention
mask 1, the same work for all three); MFU of the computed tokens (``model_flops_per_token`` at each batch's length;
for unpad at each window's own length). A check first runs the padded and the unpadded model (the same weights,
dropout off) on the same batches in bf16 and reports the largest difference of their losses.
"""

from __future__ import annotations

import argparse
import gc
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_bert import CountedBatches, timed_steps
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
    write_part,
)
from harness import add_common_arguments, bench_config, build_our_trainer, endless, median
from transformers import PretrainedConfig

from distqa.distributed.precision import Precision
from distqa.distributed.runtime import local_runtime
from distqa.encoders.flops import model_flops_per_token
from distqa.encoders.pretrained import load_encoder_config
from distqa.qa.config import QAConfig
from distqa.qa.model import build_model, forward, qa_loss
from distqa.qa.squad.synthetic import write
from distqa.record.throughput import peak_bf16_flops
from distqa.tasks import make_task

LAYOUTS = {"padded": ("--trim-padding", "false"), "trim": ("--trim-padding", "true"),
           "unpad": ("--trim-padding", "true", "--unpad", "true")}
"""Each contender's flags of distqa.train."""
FILLER_WORDS = 60
LOSS_CHECK_BATCHES = 4
LOSS_TOLERANCE = 0.01
"""The largest relative difference of the loss that bf16 rounding explains (8 bits of mantissa, 12 layers)."""


@dataclass
class Row(Measured):
    """One contender's figures; ``tokens_per_s`` counts the positions the model computes."""

    name: str
    layout: str
    compile: bool
    useful_tokens_per_s: float | None = None


class Counted(CountedBatches):
    """:class:`gpu_bert.CountedBatches` (positions and their FLOPs at each batch's length) plus the real tokens, and
    the FLOPs at each window's own length: what an unpadded batch computes. FLOPs per token are linear in the
    length (``a + b·s``, distqa.encoders.flops), so a window of ``s`` tokens costs ``s·(a + b·s)``."""

    COUNTERS = (*CountedBatches.COUNTERS, "useful", "useful_flops")

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]], model_config: PretrainedConfig) -> None:
        super().__init__(batches, model_config)
        one, two = (model_flops_per_token(model_config, length) for length in (1, 2))
        self.per_token, self.per_token_and_length = 2 * one - two, two - one
        self.useful = 0
        self.useful_flops = 0.0

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = super().__next__()
        lengths = batch["attention_mask"].sum(dim=1).double()  # on the host: the loader's batch, not yet moved
        self.useful += int(lengths.sum())
        self.useful_flops += float((lengths * (self.per_token + self.per_token_and_length * lengths)).sum())
        return batch


def squad_windows_flags(work: Path, articles: int) -> list[str]:
    """Flags of distqa.train that train the squad task on a synthetic file of ``articles`` articles under ``work``."""
    path = work / "squad" / "train.jsonl"
    path.parent.mkdir(parents=True)
    write(path, articles, seed=0, filler_words=FILLER_WORDS)
    return ["--task", "squad", "--squad-train-file", str(path), "--squad-validation-file", "",
            "--validation-fraction", "0", "--squad-cache-dir", str(work / "squad-cache"), "--num-proc", "1"]


def measure(name: str, layout: str, compiled: bool, config: QAConfig, windows: list[dict[str, torch.Tensor]],
            device: torch.device, args: argparse.Namespace, work: Path, peak_flops: float | None) -> Row:
    """Our trainer over ``windows``, warmed up, then ``args.repeats`` × ``args.steps`` timed steps."""
    row = Row(name=name, layout=layout, compile=compiled)
    trainer = build_our_trainer(config, local_runtime(device.type), windows, work)  # type: ignore[arg-type]
    batches = Counted(endless(trainer.loader), load_encoder_config(config))
    row.warmup_s, repeats = timed_steps(trainer, batches, device, args)
    # An unpadded batch computes its real tokens only, at each window's own length.
    computed, flops = ("useful", "useful_flops") if layout == "unpad" else ("tokens", "flops")
    samples = [repeat.counted["samples"] / repeat.seconds for repeat in repeats]
    row.samples_per_s, row.repeats = median(samples), samples
    row.tokens_per_s = median([repeat.counted[computed] / repeat.seconds for repeat in repeats])
    row.useful_tokens_per_s = median([repeat.counted["useful"] / repeat.seconds for repeat in repeats])
    if peak_flops is not None:  # the FLOPs computed over every timed step, per second
        row.mfu = sum(r.counted[flops] for r in repeats) / sum(r.seconds for r in repeats) / peak_flops
    return row


def loss_difference(flags: list[str], device: torch.device) -> dict[str, float]:
    """The padded and the unpadded model of ``flags`` (the same weights, dropout off) in bf16 on the same batches:
    the largest absolute and relative difference of their losses."""
    config = bench_config(*flags, "--dropout", "0")
    padded = build_model(config).to(device)
    unpadded = build_model(bench_config(*flags, "--dropout", "0", "--unpad", "true")).to(device)
    unpadded.load_state_dict(padded.state_dict())
    task, precision = make_task(config), Precision.choose("bf16", device)
    batches = iter(torch.utils.data.DataLoader(task.train_dataset(), batch_size=config.per_rank_batch_size,
                                               collate_fn=task.collate))
    absolute = relative = 0.0
    with torch.no_grad(), precision.autocast():
        for _, batch in zip(range(LOSS_CHECK_BATCHES), batches, strict=False):
            batch = {key: value.to(device) for key, value in batch.items()}
            losses = [float(qa_loss(forward(model, batch), batch)) for model in (padded, unpadded)]
            absolute = max(absolute, abs(losses[1] - losses[0]))
            relative = max(relative, abs(losses[1] - losses[0]) / abs(losses[0]))
    return {"batches": LOSS_CHECK_BATCHES, "max_abs_difference": absolute, "max_relative_difference": relative,
            "tolerance": LOSS_TOLERANCE}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    add_device_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="windows per optimizer step (one micro-batch)")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per repeat")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps first (compile happens here, and recompiles for the lengths that vary)")
    parser.add_argument("--seq-len", type=int, default=384, help="max_seq_len of the windows")
    parser.add_argument("--articles", type=int, default=300, help="synthetic SQuAD articles (about 9 windows each)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help='only these contenders, by name (e.g. "unpad compile")')
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.warmup, args.batch_size, args.articles = 1, 1, 1, 4, 3
    device = start_training_part(args)
    logging.getLogger("distqa").setLevel(logging.WARNING)
    peak_flops = peak_bf16_flops(device_name(device)) if device.type == "cuda" else None

    rows, failed = [], False
    with model_flags(model_name(args)) as flags, tempfile.TemporaryDirectory(prefix="bench-gpu-packing-") as work:
        base = [*flags, *squad_windows_flags(Path(work), args.articles), "--device", device.type,
                "--precision", "bf16", "--max-seq-len", str(args.seq_len), "--max-question-len", "64",
                "--per-rank-batch-size", str(args.batch_size), "--global-batch-size", str(args.batch_size),
                "--warmup-steps", "10", "--num-workers", "4" if device.type == "cuda" else "0"]
        task = make_task(bench_config(*base))
        task.check_inputs(may_build=True)  # the squad cache, built once
        # Held in memory (a list is a map-style dataset): the feature cache's reads are not what is measured.
        dataset = task.train_dataset()
        windows = [dataset[index] for index in range(len(dataset))]
        lengths = [int(window["attention_mask"].sum()) for window in windows]
        print(f"{len(windows)} windows, {sum(lengths) / len(lengths):.0f} of {args.seq_len} tokens each on average",
              flush=True)
        loss_check = loss_difference(base, device)
        print(f"loss, unpadded vs padded (bf16): largest difference {loss_check['max_abs_difference']:.2e} "
              f"({loss_check['max_relative_difference']:.2e} relative)", flush=True)
        for compiled in (False, True):
            for layout, layout_flags in LAYOUTS.items():
                name = f"{layout}{' compile' if compiled else ''}"
                if args.only and name not in args.only:
                    continue
                print(f"{name} …", flush=True)
                reset_peak_memory(device)
                try:
                    if compiled and args.quick and device.type != "cuda":  # as gpu_bert.py: no cold inductor compile
                        row = Row(name=name, layout=layout, compile=compiled,
                                  note="n/a (--quick on CPU: no inductor compile)")
                    else:
                        config = bench_config(*base, *layout_flags, "--compile", str(compiled).lower())
                        row = measure(name, layout, compiled, config, windows, device, args, Path(work), peak_flops)
                        row.peak_memory_gib = peak_memory_gib(device)
                except Exception as err:  # one contender failing (a compile error, out of memory) spoils no other
                    failed = True
                    row = Row(name=name, layout=layout, compile=compiled, note=f"FAILED: {first_line(err)}")
                rows.append(row)
                gc.collect()  # the contender's model, optimizer and compiled graphs, before the next one's peak
                torch.compiler.reset()
    write_part(args.json, "packing", device, model=model_name(args), seq_len=args.seq_len, batch_size=args.batch_size,
               steps=args.steps, repeats=args.repeats, warmup=args.warmup, windows=len(lengths),
               mean_window_tokens=sum(lengths) / len(lengths), peak_flops=peak_flops, loss_check=loss_check,
               rows=[vars(row) for row in rows])
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
