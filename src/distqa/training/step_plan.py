"""How a run's optimizer steps are laid out for its world size: micro-batches per step and their real rows on this
rank, steps per epoch, the last step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from distqa.config import Config, ConfigError
from distqa.distributed.elastic import split_line
from distqa.distributed.sampler import ResumableDistributedSampler, real_rows
from distqa.tasks.base import Batch


@dataclass(frozen=True)
class StepPlan:
    """How many optimizer steps the run takes, and micro-batches per step, for this world size and rank."""

    accumulation: int
    """Micro-batches per optimizer step on each rank (the same on every rank)."""
    steps_per_epoch: int
    """Whole global batches in the training set: dataset size // global_batch_size."""
    total_steps: int
    """Where the learning-rate schedule ends: max_steps, or epochs × steps_per_epoch."""
    real_rows: tuple[int, ...] = ()
    """This rank's real examples in each micro-batch of a step (the rest are padding, weighed 0); empty: all real."""
    loss_scale: tuple[float, ...] = ()
    """What each micro-batch's mean loss (over its real rows) is divided by, so that the update is the mean over the
    global batch: global_batch_size / (real rows × world size), once DDP averaged over the ranks (0 rows: inf, the
    micro-batch counts 0); empty: the accumulation."""
    split: str = ""
    """How the world size trains the global batch, for the log (:func:`~distqa.distributed.elastic.split_line`)."""

    @classmethod
    def of(cls, config: Config, sampler: ResumableDistributedSampler, world_size: int) -> StepPlan:
        accumulation = config.accumulation_steps(world_size)
        if sampler.rows_per_step != accumulation * config.per_rank_batch_size:
            raise ValueError(f"the sampler yields {sampler.rows_per_step} rows per step, the plan takes "
                             f"{accumulation} × {config.per_rank_batch_size}: build it with distqa.train.build_loader")
        steps_per_epoch = sampler.steps_left(0)
        if steps_per_epoch == 0:
            raise ConfigError(
                f"the dataset ({len(sampler.dataset)} examples) is smaller than one global batch "
                f"({config.global_batch_size}); use more data or a smaller global_batch_size.")
        rows = real_rows(sampler.share, config.per_rank_batch_size, accumulation)
        # G / (k × W) is exactly the accumulation when every micro-batch is full (k × W × accumulation = G): the
        # loss is divided as before uneven shares, bit for bit.
        scale = tuple(config.global_batch_size / (k * world_size) if k else float("inf") for k in rows)
        return cls(accumulation, steps_per_epoch, config.max_steps or config.epochs * steps_per_epoch, rows, scale,
                   split_line(config, world_size))


def real_rows_of(tree: Any, rows: int, micro_batch_size: int) -> Any:
    """``tree`` (a model's output, a batch: tensors in dicts, lists, tuples or any registered pytree) with every
    tensor whose first dimension is the micro-batch size cut to its first ``rows`` rows: the real examples of a
    padded micro-batch. Other leaves (scalars, strings, None) stay as they are; an object the walk cannot see into
    is an error, since its tensors could not be cut."""
    def cut(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return leaf[:rows] if leaf.ndim > 0 and leaf.shape[0] == micro_batch_size else leaf
        if leaf is None or isinstance(leaf, (bool, int, float, complex, str, bytes)):
            return leaf
        raise TypeError(f"a {type(leaf).__name__} in the model's output or the batch: a micro-batch padded to "
                        f"{micro_batch_size} rows ({rows} real) is cut to its real rows before Task.loss, which needs "
                        "tensors in dicts, lists, tuples or a registered pytree (torch.utils._pytree)")
    return pytree.tree_map(cut, tree)


def micro_batch_loss(loss: Callable[[Any, Batch], torch.Tensor], output: Any, batch: Batch, plan: StepPlan,
                     micro_step: int, micro_batch_size: int) -> torch.Tensor:
    """One micro-batch's share of the step's loss: the task's mean loss over its real rows divided by
    :attr:`StepPlan.loss_scale`, so that, once DDP averaged the gradients over the ranks, the update is the mean over
    the global batch's examples. A micro-batch of padding alone contributes 0 × its loss: every parameter stays in the
    graph (DDP's all-reduce expects a gradient for each), none moves."""
    if not plan.real_rows:  # a plan without uneven shares: every row is real
        return loss(output, batch) / plan.accumulation
    rows = plan.real_rows[micro_step]
    if rows == 0:
        return loss(output, batch) * 0.0
    if rows < micro_batch_size:
        output, batch = real_rows_of(output, rows, micro_batch_size), real_rows_of(batch, rows, micro_batch_size)
    return loss(output, batch) / plan.loss_scale[micro_step]
