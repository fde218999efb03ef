"""Sharded checkpoints (``--checkpoint-format sharded``, distqa.checkpoint.sharded) where no peer is needed: rotation
counting files and directories together, the stop deadline of a sharded write, and which runs write sharded by
default. They run in this process, with one process's writer (the same format: DCP without a process group); the
real multi-rank writes, resumes and faults: tests/distributed/test_sharded_checkpoints.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from distqa.checkpoint.format import Progress, TrainingCheckpoint
from distqa.checkpoint.run_folder import checkpoint_path, list_checkpoints, newest_intact_checkpoint
from distqa.checkpoint.sharded import (
    ShardedCheckpointWriter,
    load_sharded,
    sharded_checkpoint_path,
    uses_sharded_checkpoints,
)
from distqa.config.sources import load_config
from distqa.distributed.stop import StopWindow

from support.compare import max_difference
from support.repo import MACHINERY_ARGS


def training_state(step: int) -> TrainingCheckpoint:
    return TrainingCheckpoint(model={}, config={"task": "machinery-test"}, task_state=None, evaluation=None,
                              progress=Progress(step=step), versions={}, optimizer={}, scheduler={}, scaler={}, rng=[],
                              world_size=1, saved_by_rank=0)


def test_rotation_counts_files_and_directories_and_files_still_load(tmp_path: Path) -> None:
    """keep_checkpoints 2 over a run that wrote a file (format 3) before sharded directories: the oldest goes first
    whichever its kind; a newer file beside directories is the one a resume takes, and loads."""
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    full = {**training_state(1).to_state(), "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    TrainingCheckpoint.from_state(full).save(checkpoint_path(tmp_path, 1))
    writer = ShardedCheckpointWriter(tmp_path, 2, torch.device("cpu"), background=False)
    kept = []
    for step in (2, 3, 4):
        writer.submit_sharded(step, model, optimizer, training_state(step))
        kept.append([p.name for p in list_checkpoints(tmp_path)])
    assert kept == [["step-00000001.pt", "step-00000002.dcp"], ["step-00000002.dcp", "step-00000003.dcp"],
                    ["step-00000003.dcp", "step-00000004.dcp"]]
    TrainingCheckpoint.from_state({**full, "progress": {"step": 5}}).save(checkpoint_path(tmp_path, 5))
    found = newest_intact_checkpoint(tmp_path)
    assert found is not None and found.path.name == "step-00000005.pt"
    assert max_difference(found.checkpoint.model, model.state_dict()) == 0
    assert max_difference(load_sharded(sharded_checkpoint_path(tmp_path, 4)).model, model.state_dict()) == 0


def test_a_sharded_write_longer_than_the_stop_window_is_warned_about(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The first sharded write goes through the deadline check with all its bytes; a window it does not fit is a
    warning naming the directory (the second write is not checked again)."""
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    writer = ShardedCheckpointWriter(tmp_path, 3, torch.device("cpu"), stop_window=StopWindow(0.0, "a 0 s window",
                                                                                              "a longer window"))
    with caplog.at_level(logging.INFO, logger="distqa.checkpoint.writer"), writer.finishing():
        for step in (1, 2):
            writer.submit_sharded(step, model, optimizer, training_state(step))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step-00000001.dcp is" in warnings[0] and "more than a 0 s window" in warnings[0]


def test_by_default_a_sharded_run_of_several_ranks_writes_sharded_checkpoints_and_others_write_files() -> None:
    """checkpoint_format's default, auto: no rank of a fsdp/hsdp run holds the whole state for a save; DDP and a
    single process keep the one file."""
    assert load_config(MACHINERY_ARGS, environ={}, dotenv_path="/nonexistent").checkpoint_format == "auto"
    assert uses_sharded_checkpoints("auto", "fsdp", 2) and uses_sharded_checkpoints("auto", "hsdp", 4)
    assert not uses_sharded_checkpoints("auto", "ddp", 2) and not uses_sharded_checkpoints("auto", "fsdp", 1)
    assert uses_sharded_checkpoints("sharded", "fsdp", 2) and not uses_sharded_checkpoints("file", "fsdp", 2)
