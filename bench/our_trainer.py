"""Our trainer, built as ``distqa.train`` builds it, for any task: what the benchmarks time (bench/harness.py
re-exports it) and what tests/test_checkpoint_io.py drives in one process. It knows only the Task interface, so a
fork keeps it when it leaves the QA tasks' benchmarks out (template.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from distqa.config import Config
from distqa.ddp import training_module
from distqa.distributed import Runtime
from distqa.optim import Precision, build_optimizer, build_scheduler
from distqa.rng import seed_everything
from distqa.tasks import make_task
from distqa.train import build_loader
from distqa.trainer import StepPlan, Trainer

BENCH_SEED = 0


def build_our_trainer(config: Config, runtime: Runtime, dataset: Dataset, run_dir: Path,
                      **ddp_options: Any) -> Trainer:
    """A :class:`distqa.trainer.Trainer` over the real model, loader, optimizer, schedule and precision,
    from the same seed as ``distqa.train`` (nothing resumed, no evaluation); ``ddp_options`` replace
    keyword arguments of DistributedDataParallel (:func:`distqa.ddp.wrap_ddp`)."""
    task = make_task(config)
    loader = build_loader(config, runtime, dataset, task.collate)
    plan = StepPlan.of(config, loader.sampler, runtime.world_size)
    seed_everything(BENCH_SEED)
    model = task.build_model().to(runtime.device)
    optimizer = build_optimizer(model, config, runtime.device)
    return Trainer(config=config, runtime=runtime, run_dir=run_dir, task=task, model=model,
                   ddp_model=training_module(model, runtime, config, task.sync_buffers, **ddp_options),
                   optimizer=optimizer, scheduler=build_scheduler(optimizer, config, plan.total_steps),
                   precision=Precision.choose(config.precision, runtime.device), loader=loader, plan=plan,
                   evaluator=None, resumed=None)
