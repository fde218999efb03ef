"""The nq task's state in a checkpoint: the decoding tuned on the validation split goes in as the task gives it and
comes back from a step checkpoint as inference reads it (the schema itself: tests/unit/test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from distqa.checkpoint.format import ModelCheckpoint, Progress, TrainingCheckpoint, load_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path
from distqa.qa.nq.decode import Decoding, Thresholds


def test_the_decoding_round_trips_through_a_step_checkpoint(tmp_path: Path) -> None:
    decoding = Decoding(Thresholds(1.5, -0.5), max_answer_len=30)
    path = checkpoint_path(tmp_path, 4)
    TrainingCheckpoint(model={"w": torch.arange(3.0)}, config={"run_name": "r", "task": "nq"},
                       task_state=decoding.to_dict(), evaluation={"step": 4, "micro_f1": 0.5},
                       progress=Progress(step=4), versions={"distqa": "x"}, optimizer={"state": {}},
                       scheduler={"last_epoch": 4}, scaler={}, rng=[{"python": 1}], world_size=1,
                       saved_by_rank=0).save(path)
    assert Decoding.from_dict(load_checkpoint(path, ModelCheckpoint).task_state) == decoding
