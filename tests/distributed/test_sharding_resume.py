"""A sharded run resumed at another world size (issue 33 part 4, the single-file checkpoint format).

Real gloo runs of the machinery task with ``--data-parallel fsdp``, fp32, dropout 0, the global batch of 16 on any
world size (4 ranks × 4 texts, or 2 ranks × 4 texts × 2 micro-batches), 100 training texts (6 steps an epoch), so
every resume below lands inside an epoch: restoring the sample position matters. Three runs, started once for the
module (:func:`runs`):

  four        4 ranks, from scratch to step 6, checkpoints at 2, 4, 6: the uninterrupted reference
  four_to_two 2 ranks, resumed from four's step-2 checkpoint (written by 4 ranks), to step 6
  two_to_four 4 ranks, resumed from four_to_two's step-4 checkpoint (written by 2 ranks), to step 6

The reference is the uninterrupted 4-rank run: the global batch, its texts and their order do not depend on the
world size, so a run that changed world size continues the same run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from support.compare import final_weights, max_difference
from support.repo import reviews
from support.runs import run_training
from support.shared_runs import sharding_run_args as run_args

STEPS = 6
ACROSS_WORLD_SIZES = 1e-5
"""Weights of a run resumed at another world size against the uninterrupted one. The arithmetic is the same but for
summation order: the gradient is reduce-scattered over 2 ranks instead of 4 (and accumulated over 2 micro-batches on
each instead of 1), the clipping norm is summed from other per-shard partial norms, so the weights differ in float
rounding (2e-9 measured here after 6 steps; 1e-5, as across strategies in tests/distributed/test_sharding.py, leaves
room for Adam's division by small second moments, while a sample position not restored shows as 1e-3). Not 1e-6 as for
an exact resume at the same world size (tests/distributed/test_sharding.py), whose arithmetic is identical. Dropout is 0
because the dropout generators are reseeded at another world size (distqa.checkpoint.resume.restore_training_state)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Run name -> (its run directory, its output). 125 reviews: 100 training texts, 25 to validate."""
    output_dir = tmp_path_factory.mktemp("sharding_resume")
    data = reviews(output_dir, 125)
    outputs: dict[str, str] = {}

    def train(name: str, nproc: int, *extra: str) -> None:
        per_rank = 4  # 16 / (4 × nproc) micro-batches per step: 1 on 4 ranks, 2 on 2
        args = run_args(data, output_dir, name, per_rank, "--data-parallel", "fsdp", "--eval-every", "0", *extra)
        args[args.index("--max-steps") + 1] = str(STEPS)
        result = run_training(args, nproc=nproc)
        outputs[name] = result.stdout + result.stderr

    train("four", 4)
    train("four_to_two", 2, "--resume", str(output_dir / "four" / "checkpoints" / "step-00000002.pt"))
    train("two_to_four", 4, "--resume", str(output_dir / "four_to_two" / "checkpoints" / "step-00000004.pt"))
    return {name: (output_dir / name, output) for name, output in outputs.items()}


def checkpoint_at(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step-{step:08d}.pt", map_location="cpu", weights_only=True)


@pytest.mark.parametrize(("resumed", "from_step", "world_size", "checkpoint_world_size"),
                         [("four_to_two", 2, 2, 4), ("two_to_four", 4, 4, 2)])
def test_a_sharded_run_resumed_at_another_world_size_continues_the_uninterrupted_run(
        runs: dict[str, tuple[Path, str]], resumed: str, from_step: int, world_size: int,
        checkpoint_world_size: int) -> None:
    """4 → 2 and 2 → 4 ranks: each resumed run picks up at its checkpoint's step and sample position (mid-epoch),
    runs on the new world size with the dropout generators reseeded, and ends at the reference's step, epoch and
    sample position with its weights and Adam moments (ACROSS_WORLD_SIZES: summation order only)."""
    run_dir, output = runs[resumed]
    starts = re.findall(r"rank \d of (\d) \(node \d, local rank \d\) on cpu with gloo, data parallel (\w+);", output)
    assert sorted(starts) == [(str(world_size), "fsdp")] * world_size, starts
    position = re.search(rf"resumed from \S+step-{from_step:08d}\.pt at step {from_step} \(epoch 0, "
                         rf"{16 * from_step} examples into it\)", output)
    assert position, output
    assert f"checkpoint came from world size {checkpoint_world_size}, now {world_size}" in output

    reference, ended = checkpoint_at(runs["four"][0], STEPS), checkpoint_at(run_dir, STEPS)
    assert ended["progress"] == reference["progress"]
    assert ended["progress"]["step"] == STEPS and ended["progress"]["samples_in_epoch"] == 16 * STEPS
    difference = max_difference(final_weights(run_dir), reference["model"])
    assert difference < ACROSS_WORLD_SIZES, f"{resumed} differs from the uninterrupted run by {difference:.2e}"
    for index, state in reference["optimizer"]["state"].items():
        torch.testing.assert_close(ended["optimizer"]["state"][index]["exp_avg"], state["exp_avg"], rtol=1e-4,
                                   atol=1e-8)
    assert len(ended["rng"]) == world_size  # the next resume at this world size is exact again
