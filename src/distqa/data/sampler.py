"""A DistributedSampler that can start part-way through an epoch, for exact mid-epoch resumption."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` + :meth:`resume_at`.

    ``DistributedSampler`` deals the epoch's permutation out round-robin (rank r gets positions
    r, r + W, r + 2W, …), so skipping the first k indices on every rank skips exactly the first k × W
    examples of the epoch: a run can resume mid-epoch at the same example, whatever its world size.
    """

    start_index = 0

    def resume_at(self, samples_seen_in_epoch: int) -> None:
        """Skip the examples the whole job already consumed this epoch; applies to the next epoch
        iterated (call after ``set_epoch``) and resets afterwards."""
        self.start_index = samples_seen_in_epoch // self.num_replicas

    def __iter__(self) -> Iterator[int]:
        start, self.start_index = self.start_index, 0
        return itertools.islice(super().__iter__(), start, None)
