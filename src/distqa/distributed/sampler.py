"""Disjoint, covering rank shards of each epoch's permutation, resumable mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` without its padding, plus :meth:`resume_at`.

    The epoch's permutation (the same one ``DistributedSampler`` draws) is dealt out round-robin:
    rank r gets positions r, r + W, r + 2W, … Unlike ``DistributedSampler`` no index is repeated
    to even out the shares, so the ranks' shares are disjoint and together cover the whole set;
    shares differ by at most one example, and the trainer runs ``min_samples_per_rank`` on
    every rank so all ranks take the same number of steps.

    Skipping the first k indices on every rank skips exactly the first k × W examples of the
    epoch, so a run resumes mid-epoch at the same example whatever its world size.
    """

    start_index = 0

    def __init__(self, dataset: torch.utils.data.Dataset, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        size = len(dataset)  # type: ignore[arg-type]
        self.num_samples = len(range(rank, size, num_replicas))
        self.total_size = size

    @property
    def min_samples_per_rank(self) -> int:
        """Examples that every rank has in every epoch."""
        return self.total_size // self.num_replicas

    def resume_at(self, samples_seen_in_epoch: int) -> None:
        """Skip the examples the whole job already consumed this epoch; applies to the next epoch
        iterated (call after ``set_epoch``) and resets afterwards."""
        self.start_index = samples_seen_in_epoch // self.num_replicas

    def __iter__(self) -> Iterator[int]:
        start, self.start_index = self.start_index, 0
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.total_size, generator=generator).tolist()
        else:
            order = list(range(self.total_size))
        return iter(order[self.rank + start * self.num_replicas::self.num_replicas])
