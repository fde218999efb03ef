"""What a training run's checkpoints are built from, and the one place that builds them: the trainer's saves
(:class:`~distqa.training.trainer.Trainer` is a :class:`RunState`) and a survivor's save after a lost peer
(:mod:`distqa.training.peer_loss`, which reads the run through this class and never imports the trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distqa.checkpoint.format import ModelCheckpoint, Progress, TrainingCheckpoint
from distqa.config import Config
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime
from distqa.record.rundir import versions


@dataclass(eq=False)  # compared and hashed by identity, as the Trainer that is one
class RunState:
    """The objects of a running training whose state a checkpoint holds, and the values the loop keeps beside them."""

    config: Config
    runtime: Runtime
    run_dir: Path
    model: nn.Module
    """The bare model: its weights are what checkpoints hold and evaluation runs (never the DDP wrap)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    progress: Progress
    task_state: dict[str, Any] | None = None
    """The task's inference state from the latest evaluation, saved with the checkpoints as it is."""
    evaluation: dict[str, Any] | None = None
    """Step and metrics of the latest evaluation, saved with the checkpoints."""

    def model_checkpoint(self, model_state: dict[str, torch.Tensor]) -> ModelCheckpoint:
        """``best.pt`` of the run as it is now, with ``model_state`` as its weights (rank 0's whole ones, or none
        where the weights go elsewhere)."""
        return ModelCheckpoint(model=model_state, config=self.config.to_dict(), task_state=self.task_state,
                               evaluation=self.evaluation, progress=self.progress, versions=versions())

    def training_checkpoint(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                            rng: list[dict[str, Any] | None]) -> TrainingCheckpoint:
        """The step checkpoint of the run as it is now: :meth:`model_checkpoint`'s fields, ``optimizer_state``, the
        scheduler's and scaler's states, every rank's random generators ``rng`` (None for a rank whose state is not
        saved), and who saved it."""
        fields = vars(self.model_checkpoint(model_state))
        return TrainingCheckpoint(**fields, optimizer=optimizer_state, scheduler=self.scheduler.state_dict(),
                                  scaler=self.precision.scaler.state_dict(), rng=rng,
                                  world_size=self.runtime.world_size, saved_by_rank=self.runtime.rank)
