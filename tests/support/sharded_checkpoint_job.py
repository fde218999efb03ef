"""One rank of a sharded-checkpoint scenario (tests/distributed/test_sharded_checkpoints.py starts each rank as a
process): a small model sharded with FSDP2 over gloo, one optimizer step, the step-2 checkpoint written in the
background as a run writes it (distqa.checkpoint.sharded.ShardedCheckpointWriter), then the step-4 write meets the
scenario's fault. Prints one JSON line: what this rank saw.

``python tests/support/sharded_checkpoint_job.py SCENARIO RUN_DIR`` under RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:

- ``full-disk``: rank 1's shard write fails with ENOSPC (the stand-in below) during step 4's write;
- ``kill``: rank 0 is SIGKILLed while it writes step 4's manifest, after every rank has written its shards.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint.filesystem as dcp_filesystem
from torch import nn
from torch.distributed.fsdp import fully_shard

import distqa.checkpoint.sharded
from distqa.checkpoint.format import MANIFEST, Progress, TrainingCheckpoint
from distqa.checkpoint.sharded import ShardedCheckpointWriter
from distqa.config.errors import DiskFullError
from distqa.distributed.runtime import leave_together

real_write_item = dcp_filesystem._write_item
real_atomic_write = distqa.checkpoint.sharded.atomic_write


def full_disk_write_item(transforms, stream, data, write_item, storage_key, serialization_format):
    """torch.distributed.checkpoint.filesystem._write_item on a disk that fills up: some bytes reach the shard file,
    then the file's write raises ENOSPC, as ``stream.write`` does on a full disk."""
    stream.write(b"\0" * 16)
    raise OSError(errno.ENOSPC, "No space left on device")


def killed_writing_manifest(path: Path, write):
    if path.name == MANIFEST:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_atomic_write(path, write)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(4, 8)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def rest(step: int) -> TrainingCheckpoint:
    return TrainingCheckpoint(model={}, config={"task": "machinery-test"}, task_state=None, evaluation=None,
                              progress=Progress(step=step), versions={}, optimizer={}, scheduler={}, scaler={},
                              rng=[], world_size=dist.get_world_size(), saved_by_rank=0)


def main(scenario: str, run_dir: Path) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        writer = ShardedCheckpointWriter(run_dir, 3, torch.device("cpu"))
        train_step(model, optimizer)
        writer.submit_sharded(2, model, optimizer, rest(2) if rank == 0 else None)
        writer.wait()
        train_step(model, optimizer)
        if scenario == "full-disk" and rank == 1:
            dcp_filesystem._write_item = full_disk_write_item
        if scenario == "kill" and rank == 0:
            distqa.checkpoint.sharded.atomic_write = killed_writing_manifest
        writer.submit_sharded(4, model, optimizer, rest(4) if rank == 0 else None)
        try:
            writer.wait()
            outcome = "written"
        except DiskFullError as err:
            outcome = f"DiskFullError: {err.strerror}"
        print(json.dumps({"rank": rank, "outcome": outcome}), flush=True)
        # Both ranks leave together, as distributed_runtime has them do (rank 1 of the full-disk scenario ended with
        # SIGABRT at exit in 2 runs of 16 beside two CPU hogs without it). Rank 0 of "kill" is gone by now.
        if scenario != "kill":
            leave_together()
    finally:
        dcp_filesystem._write_item = real_write_item
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
