"""Disjoint, covering rank shares of each optimizer step's block of the epoch's permutation, resumable mid-epoch at
any world size (:class:`ResumableDistributedSampler`). A rank's share (:func:`share_of`) is padded to the step's rows
(``accumulation × per_rank_batch_size``) with copies of its own examples, which the trainer weighs 0
(:func:`real_rows`), so every micro-batch has the same shape on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


def share_of(global_batch_size: int, world_size: int, rank: int) -> int:
    """The examples of one global batch that ``rank`` takes: ceil((G - r) / W), which differ by at most one."""
    return len(range(rank, global_batch_size, world_size))


def real_rows(share: int, micro_batch_size: int, accumulation: int) -> tuple[int, ...]:
    """The real (not padding) rows of each of a step's micro-batches on a rank with ``share`` examples: full ones,
    then the rest, then none."""
    return tuple(min(micro_batch_size, max(0, share - micro_step * micro_batch_size))
                 for micro_step in range(accumulation))


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` without its padding, dealing out each step's block of the epoch, plus
    :meth:`resume_at`.

    The epoch's permutation (the one ``DistributedSampler`` draws) is cut into blocks of ``global_batch_size``
    examples from the position the run resumes at, one per optimizer step (an incomplete last block is left out, as
    ``drop_last`` would); in each block rank r takes the positions r, r + W, r + 2W, … (:func:`share_of`) and then
    ``rows_per_step - share`` copies of them, cycling, so that every rank yields ``rows_per_step`` indices per step.
    When ``rows_per_step`` is the share on every rank (W × rows_per_step = G) nothing is padded and the order is the
    one a whole-epoch round-robin deal gives: rank r takes positions r, r + W, … of the epoch.

    Without ``global_batch_size`` the epoch (from the resume position) is one block with no padding: the plain
    round-robin deal of the whole epoch.

    Skipping the first k examples of the epoch (:meth:`resume_at`) is world-size independent: the next step's block
    starts at position k of the same permutation whatever the world size, so a run resumes at the same example.
    """

    start_index = 0
    """Examples of the epoch to skip on the next iteration (:meth:`resume_at`)."""

    def __init__(self, dataset: torch.utils.data.Dataset, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, global_batch_size: int | None = None, rows_per_step: int | None = None) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.total_size = len(dataset)  # type: ignore[arg-type]
        self.global_batch_size = global_batch_size
        self.share = share_of(global_batch_size or self.total_size, num_replicas, rank)
        """Examples of each global batch this rank takes."""
        self.rows_per_step = self.share if rows_per_step is None else rows_per_step
        """Indices this rank yields per step: its share, then copies of it."""
        if self.rows_per_step < self.share:
            raise ValueError(f"rows_per_step ({rows_per_step}) is smaller than rank {rank}'s share ({self.share}) of a "
                             f"global batch of {global_batch_size} over {num_replicas} ranks")
        if global_batch_size is not None and self.share == 0:
            raise ValueError(f"rank {rank} of {num_replicas} has no example in a global batch of {global_batch_size}: "
                             "the world size must not exceed the global batch")
        self.num_samples = self.steps_left(0) * self.rows_per_step

    @property
    def min_samples_per_rank(self) -> int:
        """Real examples (not copies) that every rank has in every epoch."""
        block = self.global_batch_size or self.total_size
        return self.steps_left(0) * (block // self.num_replicas)

    def steps_left(self, samples_seen_in_epoch: int) -> int:
        """Whole blocks (optimizer steps) in the epoch after its first ``samples_seen_in_epoch`` examples."""
        if self.global_batch_size is None:
            return 1 if samples_seen_in_epoch < self.total_size else 0
        return max(0, self.total_size - samples_seen_in_epoch) // self.global_batch_size

    def resume_at(self, samples_seen_in_epoch: int) -> None:
        """Skip the examples the whole job already consumed this epoch; applies to the next epoch
        iterated (call after ``set_epoch``) and resets afterwards."""
        self.start_index = samples_seen_in_epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        start, self.start_index = self.start_index, 0  # now, not at the first next(): the skip applies once
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.total_size, generator=generator).tolist()
        else:
            order = list(range(self.total_size))
        return self._deal(order, start)

    def _deal(self, order: list[int], start: int) -> Iterator[int]:
        block = self.global_batch_size or self.total_size - start
        for step in range(self.steps_left(start)):
            first = start + step * block
            mine = order[first + self.rank:first + block:self.num_replicas]
            yield from mine
            if self.global_batch_size is not None:  # padding to the step's rows, weighed 0 by the trainer
                for copy in range(self.rows_per_step - len(mine)):
                    yield mine[copy % len(mine)]
