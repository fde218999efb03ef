"""Our trainer, built as ``distqa.train`` builds it, for any task: what the benchmarks time (bench/harness.py
re-exports it) and what tests/unit/test_checkpoint_io.py drives in one process. It knows only the Task interface, so a
fork keeps it when it leaves the QA tasks' benchmarks out (template.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from distqa.config import Config
from distqa.distributed.ddp import training_module
from distqa.distributed.runtime import Runtime
from distqa.tasks import make_task
from distqa.train import build_trainer
from distqa.training.trainer import Trainer


def build_our_trainer(config: Config, runtime: Runtime, dataset: Dataset, run_dir: Path,
                      **ddp_options: Any) -> Trainer:
    """A :class:`distqa.training.trainer.Trainer` built by :func:`distqa.train.build_trainer` over ``dataset`` (no
    evaluation; a fresh ``run_dir`` resumes nothing), DDP's wrap whatever ``config.data_parallel`` says;
    ``ddp_options`` replace keyword arguments of DistributedDataParallel (:func:`distqa.distributed.ddp.wrap_ddp`)."""
    task = make_task(config)
    return build_trainer(config, runtime, run_dir, task, dataset=dataset, evaluation=False,
                         wrap=lambda model, _: training_module(model, runtime, config, task.sync_buffers,
                                                               **ddp_options))
