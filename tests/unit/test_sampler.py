"""The resumable sampler (distqa.distributed.sampler): each rank's share of each step's global batch (uneven when the
world size does not split it, padded to whole micro-batches), and a resume at the exact example of the global order
where the run stopped, for any world size."""

from __future__ import annotations

import pytest
import torch

from distqa.distributed.sampler import ResumableDistributedSampler, real_rows, share_of


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


def steps_of(size: int, world_size: int, global_batch: int, micro_batch: int, epoch: int = 0,
             resume_at: int = 0) -> list[list[list[int]]]:
    """Each step's indices on each rank ([step][rank]), as build_loader's samplers yield them (padding included)."""
    accumulation = -(-share_of(global_batch, world_size, 0) // micro_batch)
    rows = accumulation * micro_batch
    yielded = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=5,
                                              global_batch_size=global_batch, rows_per_step=rows)
        sampler.set_epoch(epoch)
        sampler.resume_at(resume_at)
        indices = list(sampler)
        assert len(indices) == sampler.steps_left(resume_at) * rows
        yielded.append([indices[start:start + rows] for start in range(0, len(indices), rows)])
    return [list(step) for step in zip(*yielded, strict=True)]


def permutation(size: int, epoch: int) -> list[int]:
    return torch.randperm(size, generator=torch.Generator().manual_seed(5 + epoch)).tolist()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7, 32])
def test_each_step_takes_the_next_block_of_the_global_batch_in_shares_that_differ_by_at_most_one(
        world_size: int) -> None:
    size, global_batch, micro_batch = 103, 32, 5
    order, steps = permutation(size, 3), steps_of(size, world_size, global_batch, micro_batch, epoch=3)
    assert len(steps) == size // global_batch == 3
    for step, ranks in enumerate(steps):
        shares = [share_of(global_batch, world_size, rank) for rank in range(world_size)]
        assert max(shares) - min(shares) <= 1 and sum(shares) == global_batch
        real = [indices[:share] for indices, share in zip(ranks, shares, strict=True)]
        taken = [index for indices in real for index in indices]
        assert sorted(taken) == sorted(order[step * global_batch:(step + 1) * global_batch])  # disjoint, covering
        for indices, mine in zip(ranks, real, strict=True):  # the padding: copies of the rank's own examples
            assert set(indices) == set(mine)
        rows = [real_rows(share, micro_batch, len(ranks[0]) // micro_batch) for share in shares]
        assert all(sum(counts) == share for counts, share in zip(rows, shares, strict=True))
    if world_size == 7:  # 32 over 7 ranks: 5, 5, 5, 5, 4, 4, 4 in one micro-batch of 5
        assert [real_rows(share_of(32, 7, rank), 5, 1) for rank in (0, 6)] == [(5,), (4,)]
    if world_size == 3:  # 11, 11, 10 in 3 micro-batches of 5: a short one, and one of padding alone
        assert [real_rows(share_of(32, 3, rank), 5, 3) for rank in (0, 2)] == [(5, 5, 1), (5, 5, 0)]


@pytest.mark.parametrize(("world_size", "micro_batch"), [(1, 8), (2, 4), (4, 2), (4, 8), (8, 1)])
def test_an_even_split_deals_the_epoch_as_before_uneven_shares(world_size: int, micro_batch: int) -> None:
    """world size × micro-batch × accumulation = global batch: no padding, and every rank takes positions r, r + W, …
    of the epoch, as the whole-epoch deal (the sampler before uneven shares) gives them: checkpoints of older runs
    resume onto the same examples."""
    size, global_batch = 100, 32
    steps = steps_of(size, world_size, global_batch, micro_batch, epoch=1)
    for rank in range(world_size):
        whole_epoch = ResumableDistributedSampler(range(size), num_replicas=world_size, rank=rank, seed=5)
        whole_epoch.set_epoch(1)
        dealt = [index for step in steps for index in step[rank]]
        assert dealt == list(whole_epoch)[:len(dealt)] == permutation(size, 1)[rank:3 * global_batch:world_size]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 6])
def test_a_run_resumed_at_any_step_and_any_world_size_takes_the_same_examples_after_it(world_size: int) -> None:
    """Resuming at samples_in_epoch = s × global batch is world-size independent: the steps left take the same
    examples, step by step, at any world size as the uninterrupted run at another."""
    size, global_batch, micro_batch = 70, 12, 2

    def examples(steps: list[list[list[int]]], world: int) -> list[set[int]]:
        return [{i for rank, indices in enumerate(step) for i in indices[:share_of(global_batch, world, rank)]}
                for step in steps]

    uninterrupted = examples(steps_of(size, 3, global_batch, micro_batch, epoch=2), 3)
    for seen in range(len(uninterrupted) + 1):
        resumed = steps_of(size, world_size, global_batch, micro_batch, epoch=2, resume_at=seen * global_batch)
        assert examples(resumed, world_size) == uninterrupted[seen:]


def test_a_resume_position_between_blocks_starts_the_next_block_there() -> None:
    """A run resumed with another global batch than its checkpoint's: the steps go on from the exact example."""
    order = permutation(50, 0)
    steps = steps_of(50, 2, 8, 4, resume_at=12)
    assert len(steps) == (50 - 12) // 8
    assert sorted(steps[0][0] + steps[0][1]) == sorted(order[12:20])


def test_a_rank_without_an_example_or_with_too_few_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 4 of 5 has no example in a global batch of 4"):
        ResumableDistributedSampler(range(10), num_replicas=5, rank=4, global_batch_size=4, rows_per_step=1)
    with pytest.raises(ValueError, match=r"rows_per_step \(3\) is smaller than rank 0's share \(4\)"):
        ResumableDistributedSampler(range(10), num_replicas=2, rank=0, global_batch_size=8, rows_per_step=3)
