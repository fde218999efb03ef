"""Atomic checkpoint files: no partial file under a real name, newest found, old pruned, junk refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distqa.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from distqa.files import atomic_write


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "step-00000001.pt"
    save_checkpoint({"value": torch.ones(2)}, target)

    def explode(f) -> None:
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, explode)
    assert torch.equal(torch.load(target, weights_only=True)["value"], torch.ones(2))
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no temporary left over


def test_latest_orders_by_step_and_ignores_temporaries(tmp_path: Path) -> None:
    for step in (9, 100, 12):
        save_checkpoint({"step": step}, checkpoint_path(tmp_path, step))
    (tmp_path / "checkpoints" / ".step-00000200.pt.123.tmp").write_bytes(b"half")
    (tmp_path / "checkpoints" / "notes.txt").write_text("x")
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 100)
    prune_checkpoints(tmp_path, keep=2)
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 12), checkpoint_path(tmp_path, 100)]
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_loading_garbage_names_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "step-00000001.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=f"{junk} is not a readable checkpoint"):
        load_checkpoint(junk)
    torch.save({"model": {}}, junk)
    with pytest.raises(ValueError, match=r"missing .*'optimizer'"):
        load_checkpoint(junk)
