"""Atomic checkpoint files: no partial file under a real name, newest found, old pruned, junk refused; the
schema: what a step checkpoint and best.pt hold, a format-2 file refused with what to do, and a file of another format
version refused by name;
integrity: a truncated or bit-flipped checkpoint detected by its sidecar and skipped for the previous
one, a full disk reported with the folder and its free space, the previous checkpoint intact."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.files import atomic_write
from distqa.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    ModelCheckpoint,
    Progress,
    TrainingCheckpoint,
    digest_path,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from distqa.checkpoint.run_folder import (
    best_checkpoint_path,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    newest_intact_checkpoint,
    prune_checkpoints,
)
from distqa.config.errors import DiskFullError


def test_a_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "step-00000001.pt"
    save_checkpoint({"value": torch.ones(2)}, target)

    def explode(f) -> None:
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, explode)
    assert torch.equal(torch.load(target, weights_only=True)["value"], torch.ones(2))
    # No temporary left over; the sidecar is that of the intact file.
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, digest_path(target).name]
    assert verify_checkpoint(target)


def test_latest_orders_by_step_and_ignores_temporaries(tmp_path: Path) -> None:
    for step in (9, 100, 12):
        save_checkpoint({"step": step}, checkpoint_path(tmp_path, step))
    (tmp_path / "checkpoints" / ".step-00000200.pt.123.tmp").write_bytes(b"half")
    (tmp_path / "checkpoints" / "notes.txt").write_text("x")
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 100)
    prune_checkpoints(tmp_path, keep=2)
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 12), checkpoint_path(tmp_path, 100)]
    assert not digest_path(checkpoint_path(tmp_path, 9)).exists(), "a pruned checkpoint's sidecar goes with it"
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_loading_garbage_names_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "step-00000001.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=f"{junk} is not a readable checkpoint"):
        load_checkpoint(junk)
    torch.save({"model": {}}, junk)
    with pytest.raises(ValueError, match=r"missing .*'optimizer'"):
        load_checkpoint(junk)


def a_model_checkpoint(**extra: object) -> dict[str, object]:
    return {"model": {"w": torch.ones(2)}, "config": {"run_name": "r"}, "task_state": None, "evaluation": None,
            "progress": {"step": 4, "epoch": 0, "samples_in_epoch": 32, "best_metric": None, "best_mode": None,
                         "best_value": None},
            "versions": {"distqa": "0.1.0"}, **extra}


def test_a_training_checkpoint_round_trips_through_its_schema(tmp_path: Path) -> None:
    task_state = {"long_threshold": 1.5, "short_threshold": -0.5, "max_answer_len": 30}  # opaque: the task's
    written = TrainingCheckpoint(
        model={"w": torch.arange(3.0)}, config={"run_name": "r", "task": "nq"},
        task_state=task_state, evaluation={"step": 4, "micro_f1": 0.5},
        progress=Progress(step=4, epoch=1, samples_in_epoch=16, best_metric="micro_f1", best_mode="max",
                          best_value=0.5), versions={"distqa": "x"},
        optimizer={"state": {}}, scheduler={"last_epoch": 4}, scaler={}, rng=[{"python": 1}, {"python": 2}],
        world_size=2, saved_by_rank=0)
    path = checkpoint_path(tmp_path, 4)
    written.save(path)
    on_disk = torch.load(path, weights_only=True)
    assert on_disk["format_version"] == FORMAT_VERSION == 3
    assert on_disk["task_state"] == {"long_threshold": 1.5, "short_threshold": -0.5, "max_answer_len": 30}
    assert on_disk["progress"] == {"step": 4, "epoch": 1, "samples_in_epoch": 16, "best_metric": "micro_f1",
                                   "best_mode": "max", "best_value": 0.5,
                                   "evaluations_without_improvement": 0, "tracking_run_id": None,
                                   "pruned_at": 0, "seeds_per_step": False}
    read = load_checkpoint(path)
    assert isinstance(read, TrainingCheckpoint)
    assert torch.equal(read.model["w"], written.model["w"])
    assert (read.task_state, read.progress, read.rng, read.world_size) == (written.task_state, written.progress,
                                                                            written.rng, 2)
    # What inference needs reads from a step checkpoint too, as the task gave it.
    assert load_checkpoint(path, ModelCheckpoint).task_state == task_state


def a_format_2_checkpoint(path: Path) -> Path:
    """A file as distqa wrote it before the task seam (format 2): NQ's decoding, the best micro-F1, the dataset."""
    state = a_model_checkpoint(format_version=2, optimizer={}, scheduler={}, scaler={}, rng=[{}], world_size=1,
                               saved_by_rank=0)
    del state["task_state"]
    state |= {"decoding": {"long_threshold": 1.5, "short_threshold": -0.5, "max_answer_len": 30},
              "config": {"run_name": "r", "dataset": "nq"},
              "progress": {"step": 4, "epoch": 0, "samples_in_epoch": 32, "best_micro_f1": 0.25}}
    save_checkpoint(state, path)
    return path


@pytest.mark.parametrize("kind", [ModelCheckpoint, TrainingCheckpoint])
def test_a_format_2_checkpoint_is_refused_in_one_line_that_says_what_to_do(kind: type[ModelCheckpoint],
                                                                            tmp_path: Path) -> None:
    """No migration any more: the file named, who wrote it, and the two ways on (convert it with 0.1, or retrain),
    before any complaint about the fields format 2 lacks."""
    path = a_format_2_checkpoint(tmp_path / "step-00000004.pt")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path, kind)
    assert str(refused.value) == (
        f"{path} is a checkpoint of format 2, written by distqa before 0.2.0 (before the task seam), which this distqa "
        "no longer reads: with distqa 0.1, which migrates it, load it (distqa.checkpoint.format.load_checkpoint) and "
        "save it again (.save(new_path)), or train anew (--resume none).")


def test_best_pt_holds_no_training_state_and_says_so(tmp_path: Path) -> None:
    path = best_checkpoint_path(tmp_path)
    ModelCheckpoint.from_state(a_model_checkpoint()).save(path)
    assert load_checkpoint(path, ModelCheckpoint).progress.step == 4
    with pytest.raises(CheckpointError, match=r"missing \['optimizer', .*best.pt does not: resume from a step"):
        load_checkpoint(path)


@pytest.mark.parametrize(("version", "age"), [(None, "an older"), (1, "an older"), (FORMAT_VERSION + 1, "a newer")])
def test_a_checkpoint_of_another_format_version_is_refused(version: int | None, age: str, tmp_path: Path) -> None:
    """The unversioned files of the first releases (version 1) and files of later versions are refused by
    name and version, with the fix, instead of failing somewhere in load_state_dict."""
    path = tmp_path / "best.pt"
    state = a_model_checkpoint() if version is None else a_model_checkpoint(format_version=version)
    torch.save(state, path)
    shown = 1 if version is None else version
    with pytest.raises(CheckpointError, match=f"{path} has checkpoint format version {shown}, written by {age} "
                                              rf"distqa \(0.1.0\); this one reads version {FORMAT_VERSION}\. "
                                              r"Use the distqa version that wrote it, or train anew"):
        load_checkpoint(path, ModelCheckpoint)


def a_training_checkpoint(step: int) -> TrainingCheckpoint:
    state = a_model_checkpoint(optimizer={"state": {}}, scheduler={}, scaler={}, rng=[{"python": step}],
                               world_size=1, saved_by_rank=0)
    state["model"] = {"w": torch.full((1000,), float(step))}
    state["progress"] = {"step": step, "epoch": 0, "samples_in_epoch": 8 * step}
    return TrainingCheckpoint.from_state(state)


def truncate(path: Path) -> None:
    """What a full disk or an interrupted copy leaves: the first half of the file."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip_a_bit(path: Path) -> None:
    """Bit rot: same size, one bit different, inside the tensor data (which torch.load does not check)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_a_bit], ids=["truncated", "bit-flip"])
def test_a_damaged_newest_checkpoint_is_reported_and_the_previous_one_used(
        damage, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    for step in (2, 4):
        a_training_checkpoint(step).save(checkpoint_path(tmp_path, step))
    newest = checkpoint_path(tmp_path, 4)
    assert verify_checkpoint(newest) is True
    damage(newest)
    with pytest.raises(CheckpointError, match=f"{newest} is (truncated|corrupted)"):
        load_checkpoint(newest)
    with caplog.at_level(logging.ERROR, logger="distqa.checkpoint.format"):
        found = newest_intact_checkpoint(tmp_path)
    assert found is not None
    path, checkpoint = found.path, found.checkpoint
    assert path == checkpoint_path(tmp_path, 2) and checkpoint.progress.step == 2
    assert torch.equal(checkpoint.model["w"], torch.full((1000,), 2.0))
    reports = [r.getMessage() for r in caplog.records]
    assert len(reports) == 1 and str(newest) in reports[0] and "resuming from the one before" in reports[0]
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 2)]  # never chosen or counted again


def test_a_checkpoint_without_its_sidecar_loads_unverified(tmp_path: Path) -> None:
    """Files of earlier releases have no sidecar; torch's zip reader still refuses a truncated one."""
    path = checkpoint_path(tmp_path, 3)
    a_training_checkpoint(3).save(path)
    digest_path(path).unlink()
    assert verify_checkpoint(path) is False
    assert load_checkpoint(path).progress.step == 3
    truncate(path)
    assert newest_intact_checkpoint(tmp_path) is None


def test_a_full_disk_keeps_the_previous_checkpoint_and_names_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    previous = checkpoint_path(tmp_path, 2)
    a_training_checkpoint(2).save(previous)

    def full_disk_save(obj: object, f) -> None:
        f.write(b"PK\x03\x04 the first bytes of the archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk_save)
    folder = previous.parent
    with pytest.raises(DiskFullError, match=rf"no space left in {folder} \(\d+\.\d GB free\) while writing "
                                            r"step-00000004.pt; what was there before is intact") as raised:
        a_training_checkpoint(4).save(checkpoint_path(tmp_path, 4))
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == [previous.name, digest_path(previous).name]
    assert verify_checkpoint(previous) and load_checkpoint(previous).progress.step == 2
