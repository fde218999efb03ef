"""The resumable sampler (distqa.distributed.sampler): each rank's share of an epoch, and a resume at the exact example
of the global order where the run stopped, for any world size."""

from __future__ import annotations

import pytest

from distqa.distributed.sampler import ResumableDistributedSampler


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_sampler_resumes_at_the_same_example(world_size: int) -> None:
    dataset = list(range(64))
    global_batch, seen_steps = 8, 3

    def epoch_order(resume_at: int = 0) -> list[int]:
        ranks = []
        for rank in range(world_size):
            sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=5)
            sampler.set_epoch(2)
            sampler.resume_at(resume_at)
            ranks.append(list(sampler))
        # Interleave the ranks back into the global order they were dealt from.
        return [ranks[r][i] for i in range(len(ranks[0])) for r in range(world_size)]

    full = epoch_order()
    assert sorted(full) == dataset
    resumed = epoch_order(resume_at=seen_steps * global_batch)
    assert resumed == full[seen_steps * global_batch:]
    # The skip applies once: the next pass over the sampler is a whole epoch again.
    sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=0, seed=5)
    sampler.resume_at(16)
    assert len(list(sampler)) == 64 // world_size - 16 // world_size
    assert len(list(sampler)) == 64 // world_size
