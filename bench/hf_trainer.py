"""Our trainer against the Hugging Face ``Trainer``, on the same model, data, batch and precision.

    .venv/bin/python bench/hf_trainer.py           # about 3 minutes on 2 cores
    .venv/bin/python bench/hf_trainer.py --quick   # smoke test

Model: the tiny-cpu preset's QA model (tiny BERT from data/tiny-bert's config, span + answer-type
heads, ``distqa.qa.model.qa_loss``), fp32 on CPU, from the same initial weights. Data: the DummyDataset
(windows of max_seq_len 128, about a third with a shorter document). Batch: 8 per micro-batch, 4
micro-batches per optimizer step, the same lr, warm-up, weight decay and clipping. Contenders:

  ours        ``distqa.training.trainer.Trainer.train_step`` fed by ``distqa.train.build_loader`` (the real loader)
  hf-run_qa   ``transformers.Trainer`` as examples/pytorch/question-answering/run_qa.py configures it
              by default: ``pad_to_max_length`` true (every window padded to max_seq_length by the
              tokenizer), ``default_data_collator``, ``TrainingArguments`` defaults (optim
              ``adamw_torch_fused``, ``dataloader_num_workers`` 0, logging every 500 steps)
  hand        the minimal hand-written step (bench/harness.py) on the same loader: what no framework
              can beat without changing the compute (padding, precision, kernels)
  hf-best     the same ``Trainer`` at its best for this job: features without padding and
              ``DataCollatorWithPadding`` (padding to the longest window of the batch), fused AdamW,
              one persistent data-loader worker

The three framework contenders run again on short documents (``bench/harness.py::short_document_windows``:
synthetic NQ of 10 to 60 words, SQuAD-like), where ours trims every batch to its longest window
(``trim_padding``) and run_qa.py's default pads every window to max_seq_length; the targets are judged on
the DummyDataset, whose batches nearly always hold a full window, as NQ's do.

Checkpoint saving is off for all three (run_qa.py's default saves every 500 steps, more than a repeat
takes). Each repeat runs one warm-up step, then ``--steps`` optimizer steps, timed from the end of the
warm-up step to the end of the last (an HF ``TrainerCallback`` takes the times), data loading included.
Targets: ours >= 1.2 × hf-run_qa and >= 1.0 × hf-best, in median samples per second.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from harness import (
    BENCH_SEED,
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    endless,
    hand_written_step,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    short_document_windows,
    spread,
)
from torch import nn
from torch.utils.data import Dataset
from transformers import (
    DataCollatorWithPadding,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)
from transformers.utils import logging as hf_logging

from distqa.distributed.rng import seed_everything
from distqa.distributed.runtime import local_runtime
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.config import QAConfig
from distqa.qa.model import QAModel, build_model, forward, qa_loss

TARGET_VS_RUN_QA, TARGET_VS_BEST = 1.2, 1.0


class LossReturningModel(nn.Module):
    """Our QA model with the interface ``transformers.Trainer`` expects: labels in, ``{"loss": …}`` out."""

    def __init__(self, model: QAModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                start_positions: torch.Tensor, end_positions: torch.Tensor,
                answer_type: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                 "start_positions": start_positions, "end_positions": end_positions, "answer_type": answer_type}
        return {"loss": qa_loss(forward(self.model, batch), batch)}


class Unpadded(Dataset):
    """The windows of ``windows`` without their padding, as lists: what run_qa.py's features are with
    ``--pad_to_max_length false``, for ``DataCollatorWithPadding`` to pad per batch."""

    def __init__(self, windows: Dataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.windows[index]
        length = int(item["attention_mask"].sum())
        return {name: value[:length].tolist() if value.ndim else int(value) for name, value in item.items()}


class StepClock(TrainerCallback):
    """The time at the end of every optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if args.device.type == "cuda" and state.global_step in (1, state.max_steps):
            torch.cuda.synchronize(args.device)  # the first and last ends count the GPU's work, not its queue
        self.ends.append(time.perf_counter())


def hf_samples_per_s(config: QAConfig, dataset: Dataset, output_dir: Path, steps: int, best: bool,
                     **training_arguments: Any) -> float:
    """One run of ``transformers.Trainer`` for 1 + ``steps`` optimizer steps; samples/s after the first.
    ``training_arguments`` replace the ``TrainingArguments`` set here (bench/gpu_bert.py: a GPU, bf16, compile)."""
    seed_everything(BENCH_SEED)
    model = LossReturningModel(build_model(config))
    clock = StepClock()
    arguments = TrainingArguments(**{
        "output_dir": str(output_dir), "use_cpu": True, "seed": BENCH_SEED, "report_to": "none", "disable_tqdm": True,
        "save_strategy": "no", "per_device_train_batch_size": config.per_rank_batch_size,
        "gradient_accumulation_steps": config.global_batch_size // config.per_rank_batch_size,
        "max_steps": 1 + steps, "learning_rate": config.lr, "warmup_steps": config.warmup_steps,
        "weight_decay": config.weight_decay, "max_grad_norm": config.max_grad_norm,
        **({"dataloader_num_workers": 1, "dataloader_persistent_workers": True, "optim": "adamw_torch_fused"}
           if best else {}),
        **training_arguments})
    tokenizer = load_tokenizer(config)
    collator = DataCollatorWithPadding(tokenizer) if best else default_data_collator
    trainer = Trainer(model=model, args=arguments, train_dataset=Unpadded(dataset) if best else dataset,
                      data_collator=collator, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # it prints the final metrics dict into the report
    trainer.train()
    return steps * config.global_batch_size / (clock.ends[-1] - clock.ends[0])


def ours_samples_per_s(config: QAConfig, dataset: Dataset, run_dir: Path, steps: int, hand: bool = False) -> float:
    """Our trainer's step (or, with ``hand``, the minimal hand-written step) fed by our loader."""
    trainer = build_our_trainer(config, local_runtime("cpu"), dataset, run_dir)
    step = hand_written_step(trainer) if hand else trainer.train_step
    micro_batches = endless(trainer.loader)
    step(micro_batches)  # the warm-up step, as for the HF runs
    started = time.perf_counter()
    for _ in range(steps):
        step(micro_batches)
    return steps * config.global_batch_size / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=7)
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per contender and repeat")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 1
    pin_threads(args.threads)
    hf_logging.set_verbosity_error()
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="torch.utils.data")  # pin_memory without an accelerator

    config = bench_config("--dummy-size", "1024", "--precision", "fp32")
    dataset = dummy_dataset(config)
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as work:
        short_flags, short = short_document_windows(Path(work), 400 if args.quick else 2000)
        short_config = bench_config(*short_flags, "--precision", "fp32")
        figures = interleaved({
            "ours": lambda: ours_samples_per_s(config, dataset, Path(work), args.steps),
            "hf-run_qa": lambda: hf_samples_per_s(config, dataset, Path(work) / "hf", args.steps, best=False),
            "hf-best": lambda: hf_samples_per_s(config, dataset, Path(work) / "hf", args.steps, best=True),
            "hand": lambda: ours_samples_per_s(config, dataset, Path(work), args.steps, hand=True),
            "ours, short documents": lambda: ours_samples_per_s(short_config, short, Path(work), args.steps),
            "hf-run_qa, short documents": lambda: hf_samples_per_s(short_config, short, Path(work) / "hf", args.steps,
                                                                   best=False),
            "hf-best, short documents": lambda: hf_samples_per_s(short_config, short, Path(work) / "hf", args.steps,
                                                                 best=True),
        }, args.repeats)

    print(machine_line(args.threads))
    print(f"model: tiny BERT, fp32, max_seq_len {config.max_seq_len}; batch {config.per_rank_batch_size} × "
          f"{config.global_batch_size // config.per_rank_batch_size} micro-batches per optimizer step; DummyDataset; "
          f"{args.steps} timed steps per repeat, after one warm-up step")
    notes = {"ours": "Trainer.train_step + build_loader",
             "hf-run_qa": "padded to max_length, default_data_collator, TrainingArguments defaults",
             "hf-best": "no padding + DataCollatorWithPadding, fused AdamW, 1 persistent worker",
             "hand": "the minimal hand-written step + build_loader: the ceiling on the same compute"}
    rows = [(name, f"{median(values):.1f} samples/s", f"{spread(values)}; {notes[name.split(',')[0]]}")
            for name, values in figures.items()]
    print_table("against the Hugging Face Trainer (median throughput):", rows)
    ours, hand = median(figures["ours"]), median(figures["hand"])
    print(f"  ceiling on this compute: hand / hf-run_qa {hand / median(figures['hf-run_qa']):.3f}, "
          f"hand / hf-best {hand / median(figures['hf-best']):.3f} (all the Trainer's own overhead)")
    ours_short = median(figures["ours, short documents"])
    print(f"  short documents ({len(short)} windows of synthetic NQ documents of 10-60 words, where run_qa.py's "
          f"padding to max_length is paid in full): ours / hf-run_qa "
          f"{ours_short / median(figures['hf-run_qa, short documents']):.3f}, ours / hf-best "
          f"{ours_short / median(figures['hf-best, short documents']):.3f}")
    print_targets([
        Target("ours / hf-run_qa (run_qa.py defaults), samples/s", ours / median(figures["hf-run_qa"]),
               TARGET_VS_RUN_QA, at_most=False),
        Target("ours / hf-best, samples/s", ours / median(figures["hf-best"]), TARGET_VS_BEST, at_most=False),
    ])


if __name__ == "__main__":
    main()
