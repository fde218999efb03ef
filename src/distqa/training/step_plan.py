"""How a run's optimizer steps are laid out for its world size: micro-batches per step, steps per epoch, the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

from distqa.config import Config, ConfigError
from distqa.distributed.sampler import ResumableDistributedSampler


@dataclass(frozen=True)
class StepPlan:
    """How many optimizer steps the run takes, and micro-batches per step, for this world size."""

    accumulation: int
    """Micro-batches per optimizer step on each rank."""
    steps_per_epoch: int
    total_steps: int
    """Where the learning-rate schedule ends: max_steps, or epochs × steps_per_epoch."""

    @classmethod
    def of(cls, config: Config, sampler: ResumableDistributedSampler, world_size: int) -> StepPlan:
        accumulation = config.accumulation_steps(world_size)
        steps_per_epoch = sampler.min_samples_per_rank // config.per_rank_batch_size // accumulation
        if steps_per_epoch == 0:
            raise ConfigError(
                f"the dataset ({len(sampler.dataset)} examples) is smaller than one global batch "
                f"({config.global_batch_size}); use more data or a smaller global_batch_size.")
        return cls(accumulation, steps_per_epoch, config.max_steps or config.epochs * steps_per_epoch)
