"""What MLflow tracking costs a training step: the step with its scalars recorded to TensorBoard alone, against
TensorBoard and a real MLflow tracking server (``--tracker mlflow``), side by side.

    .venv/bin/python bench/tracking_overhead.py           # about a minute on 2 cores
    .venv/bin/python bench/tracking_overhead.py --quick   # smoke test

The server is ``mlflow server`` from ``.venv-mlflow`` (``make setup``) on 127.0.0.1 with a SQLite store; without
that environment the script prints one SKIP line. Both contenders run the trainer's own step
(``Trainer.train_step``, the tiny-cpu preset on DummyDataset batches collated beforehand) and then record what the
trainer records at a log line, as if ``log_every`` were 1 (the worst case): the 7 ``train/*`` scalars and the 4
per-rank step times through :class:`distqa.record.tracking.RunRecord`, then its ``flush``. The MLflow requests run on
the tracker's own thread, so the step should not wait for them. Target: with MLflow <= 1.05 × without, in median seconds
per step."""

from __future__ import annotations

import argparse
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from harness import (
    Target,
    add_common_arguments,
    bench_config,
    build_our_trainer,
    dummy_dataset,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    seconds_per_step,
    step_time_rows,
)
from mlflow_server import MLFLOW, mlflow_server
from torch.utils.tensorboard import SummaryWriter

from distqa.checkpoint.format import Progress
from distqa.distributed.runtime import local_runtime
from distqa.record.tracking import MLflowTracker, RunRecord, tracking_params

TARGET = 1.05
SCALARS = ("train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "train/step_time_s",
           "train/tokens_per_s", "train/padded_tokens_per_s", "ranks/step_p50_ms/rank_0", "ranks/step_p95_ms/rank_0",
           "ranks/local_p50_ms/rank_0", "ranks/local_p95_ms/rank_0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=9)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per contender and repeat")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 3, 2
    if not MLFLOW.exists():
        print(f"SKIP  bench/tracking_overhead.py: no MLflow server to run ({MLFLOW} is missing; `make setup` makes it)")
        return
    pin_threads(args.threads)

    config = bench_config("--dummy-size", "256")
    runtime = local_runtime("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as work, \
            mlflow_server(Path(work) / "server") as (uri, _):
        trainer = build_our_trainer(config, runtime, dummy_dataset(config), Path(work) / "run")
        batches = list(itertools.islice(iter(trainer.loader), 4 * trainer.plan.accumulation))
        board = SummaryWriter(Path(work) / "tensorboard")
        tracker = MLflowTracker(uri, "bench", "bench", None, tracking_params(config, runtime),
                                on_run_id=lambda run_id: None)
        records = {"tensorboard": RunRecord(board), "tensorboard + mlflow": RunRecord(board, tracker)}
        steps = {name: recorded_step(trainer.train_step, record, trainer.progress) for name, record in records.items()}
        figures = interleaved({name: (lambda step=step: seconds_per_step(step, batches, args.steps))
                               for name, step in steps.items()}, args.repeats)
        tracker.finish("FINISHED", [])
        board.close()

    print(machine_line(args.threads))
    print(f"model: tiny BERT, fp32, per-rank batch {config.per_rank_batch_size} × {trainer.plan.accumulation} "
          f"micro-batches per step; {len(SCALARS)} scalars recorded after every step; {args.steps} steps per repeat; "
          f"MLflow server on {uri} (SQLite store)")
    rows = step_time_rows(figures)
    print_table("tracking overhead (median time per optimizer step and its scalars):", rows)
    print_targets([Target("with MLflow / TensorBoard alone, time per step",
                          median(figures["tensorboard + mlflow"]) / median(figures["tensorboard"]), TARGET,
                          at_most=True)])


def recorded_step(train_step: object, record: RunRecord, progress: Progress) -> object:
    """The trainer's step followed by what it records at a log line, at the next step number."""
    def step(micro_batches: Iterator[dict[str, torch.Tensor]]) -> None:
        loss, _ = train_step(micro_batches)  # type: ignore[operator]
        progress.step += 1
        for name in SCALARS:
            record.add_scalar(name, float(loss), progress.step)
        record.flush()
    return step


if __name__ == "__main__":
    main()
