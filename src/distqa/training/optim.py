"""Optimizer and learning-rate schedule (mixed precision is :mod:`distqa.distributed.precision`).

The schedules are transformers' ``get_{linear,cosine,constant}_schedule_with_warmup`` (transformers/optimization.py),
written out here: the same ``LambdaLR`` over a ``functools.partial`` of a module-level function, the same arithmetic
step for step, so the learning rates are equal to the last bit and a scheduler's ``state_dict`` is the same
(``lr_lambdas`` holds each partial's empty ``__dict__``: checkpoints written with transformers' schedules load).
Importing transformers for them cost every training process about a second, and the machinery's runs (a fork's
task, the tests' example task) need no transformers at all.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from distqa.config import Config

log = logging.getLogger(__name__)


def build_optimizer(model: nn.Module, config: Config, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: biases and LayerNorm gains (the 1-d tensors)
    are not decayed, as in BERT. The fused kernel does the update in one launch where available."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8, fused=fused)


def build_scheduler(optimizer: torch.optim.Optimizer, config: Config, total_steps: int) -> LambdaLR:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then ``lr_schedule``: linear or cosine decay to 0 at
    ``total_steps``, or constant."""
    warmup = min(config.warmup_steps, total_steps)
    if config.lr_schedule == "constant":
        return LambdaLR(optimizer, functools.partial(_constant_with_warmup, num_warmup_steps=warmup))
    decay = {"linear": _linear_with_warmup, "cosine": _cosine_with_warmup}[config.lr_schedule]
    return LambdaLR(optimizer, functools.partial(decay, num_warmup_steps=warmup, num_training_steps=total_steps))


# The multipliers of lr at each step, as transformers.optimization's _get_*_schedule_with_warmup_lr_lambda compute
# them (the same float operations in the same order: test_lr_schedules.py compares every step for equality).
def _constant_with_warmup(current_step: int, *, num_warmup_steps: int) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _linear_with_warmup(current_step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine_with_warmup(current_step: int, *, num_warmup_steps: int, num_training_steps: int,
                        num_cycles: float = 0.5, min_lr_rate: float = 0.0) -> float:
    """Half a cosine wave (``num_cycles`` 0.5, transformers' default) from 1 to ``min_lr_rate`` (0) over the steps
    after the warm-up."""
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    factor = factor * (1 - min_lr_rate) + min_lr_rate
    return max(0, factor)
