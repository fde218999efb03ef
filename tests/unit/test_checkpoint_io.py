"""Checkpoint I/O at scale (issue 24) in one process: saves off the training step (the step after a save starts before
its write ends; a full disk in a background write still ends the run at the next save, the previous checkpoint
intact), a stager that a torch lets stage only once, and the stop's deadline: the first write compared with the window
torchrun or worker.sh leaves, with a warning naming both. The multi-process runs:
tests/distributed/test_checkpoint_io.py.

The slow storage is bench/slow_storage.py, driven by a clock of the test's (:class:`StorageClock`)."""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.checkpoint.staging import DefaultStager

import distqa.checkpoint.format
import distqa.checkpoint.writer
from distqa.checkpoint.format import Progress, TrainingCheckpoint, verify_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path, list_checkpoints
from distqa.checkpoint.writer import CheckpointWriter
from distqa.config.errors import DiskFullError
from distqa.config.sources import load_config
from distqa.distributed.runtime import local_runtime
from distqa.distributed.stop import StopWindow, graceful_stop_window
from distqa.tasks import make_task

from support.processes import clean_env, node_in_process
from support.repo import MACHINERY_ARGS, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import slow_storage
from our_trainer import build_our_trainer  # the trainer as distqa.train builds it
from slow_storage import slow_checkpoint_storage

SMALL_STEPS = ("--global-batch-size", "8", "--per-rank-batch-size", "8", "--warmup-steps", "1", "--log-every", "1",
               "--max-steps", "1000000")


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for a trainer run in this process (on a shared 2-core machine two threads spin-wait
    for each other: steps of seconds instead of tens of milliseconds); the previous number is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def a_trainer(tmp_path: Path, *flags: str):
    """The real Trainer over the machinery task's model, one process, checkpoints into tmp_path."""
    config = load_config([*MACHINERY_ARGS, *SMALL_STEPS, *flags], environ={}, dotenv_path=os.devnull)
    return build_our_trainer(config, local_runtime("cpu"), make_task(config).train_dataset(), tmp_path)


@pytest.mark.usefixtures("one_torch_thread")
# --- saves off the step ---------------------------------------------------------------------------------------
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("background", [True, False], ids=["background", "blocking"])
def test_the_step_after_a_save_starts_before_its_write_ends(
        background: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in storage holds the write of step 2's checkpoint until step 3 has started. In the background
    that happens at once; a trainer that waits for its writes (checkpoint_in_background false, the control) never
    starts step 3 meanwhile, so the storage gives up after 1 s and the order shows the step waiting."""
    trainer = a_trainer(tmp_path, "--max-steps", "4", "--checkpoint-every", "2",
                        "--checkpoint-in-background", str(background).lower())
    events: list[str] = []
    step_3_started = threading.Event()
    train_step, save = trainer.train_step, distqa.checkpoint.writer.save_checkpoint

    def recorded_step(micro_batches):
        events.append(f"step {trainer.progress.step + 1} starts")
        if trainer.progress.step + 1 == 3:
            step_3_started.set()
        return train_step(micro_batches)

    def held_save(state, path: Path) -> None:
        if path.name == "step-00000002.pt":
            step_3_started.wait(timeout=60 if background else 1)  # background: a hang guard
        save(state, path)
        events.append(f"{path.name} written")

    trainer.train_step = recorded_step
    monkeypatch.setattr(distqa.checkpoint.writer, "save_checkpoint", held_save)
    trainer.fit(SimpleNamespace(writer=None))

    step_3, written = events.index("step 3 starts"), events.index("step-00000002.pt written")
    assert (step_3 < written) == background, events
    # The end of the run waited for the last write; every file is complete, the older one pruned after it.
    assert events[-1] == "step-00000004.pt written"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002.pt", "step-00000004.pt"]
    assert all(verify_checkpoint(p) for p in list_checkpoints(tmp_path))
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))


@pytest.mark.usefixtures("one_torch_thread")
def test_a_full_disk_in_a_background_write_ends_the_run_at_the_next_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The write of step 4 fails with ENOSPC in the writer's thread; the next save (step 6) raises the DiskFullError
    in the training thread, naming the file and the folder; step 2's checkpoint is intact and nothing else is left."""
    trainer = a_trainer(tmp_path, "--max-steps", "8", "--checkpoint-every", "2", "--keep-checkpoints", "1")
    real_save = torch.save

    def full_disk_at_step_4(obj, f) -> None:
        if obj["progress"]["step"] == 4:
            f.write(b"PK\x03\x04 the first bytes of the archive")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", full_disk_at_step_4)
    with pytest.raises(DiskFullError, match=r"no space left in .*checkpoints \(.* free\) while writing "
                                            r"step-00000004.pt; what was there before is intact"):
        trainer.fit(SimpleNamespace(writer=None))
    assert trainer.progress.step == 6, "raised at the save after the failed write"
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, 2)]
    assert verify_checkpoint(checkpoint_path(tmp_path, 2))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002.pt",
                                                                              "step-00000002.pt.crc32"]


# --- the deadline ------------------------------------------------------------------------------------------------
def a_checkpoint(megabytes: float, step: int = 1) -> TrainingCheckpoint:
    return TrainingCheckpoint(
        model={"w": torch.zeros(int(megabytes * 1e6 / 4))}, config={"run_name": "r"}, task_state=None, evaluation=None,
        progress=Progress(step=step), versions={}, optimizer={"state": {}}, scheduler={}, scaler={}, rng=[{}],
        world_size=1, saved_by_rank=0)


class StorageClock:
    """Time that passes only when the stand-in storage takes it (its sleeps add up here, and the writer's
    perf_counter reads the sum): a write's measured seconds are exactly its bytes at the storage's bandwidth,
    whatever the machine's speed or load."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("background", [True, False], ids=["background", "blocking"])
def test_a_write_slower_than_the_stop_window_is_warned_about_once_with_the_numbers_and_the_fix(
        background: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MB at 2 MB/s takes 0.5 s (on the storage's clock); a stop may wait for a write in flight and then write its
    own (1 s), more than a 0.6 s window in the background (blocking: one write, 0.5 s, fits)."""
    clock = StorageClock()
    monkeypatch.setattr(slow_storage, "time", SimpleNamespace(sleep=clock.sleep))
    monkeypatch.setattr(distqa.checkpoint.writer, "time", SimpleNamespace(perf_counter=clock.perf_counter))
    window = StopWindow(0.6, "the 0.6 s of a test (NAME_OF_IT)", "a longer NAME_OF_IT")
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"), background=background, stop_window=window)
    with caplog.at_level(logging.INFO, logger="distqa.checkpoint.writer"), slow_checkpoint_storage(2.0), \
            writer.finishing():
        for step in (1, 2):
            writer.submit({checkpoint_path(tmp_path, step): a_checkpoint(1.0, step)})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    measured = f"step-00000001.pt is 1.0 MB, written in 0.5 s (2 MB/s to {tmp_path / 'checkpoints'})"
    if not background:
        assert warnings == []
        assert f"checkpoint write: {measured}; a graceful stop needs up to 0.5 s of writing, within the 0.6 s of a " \
            "test" in caplog.text, caplog.text
        return
    assert len(warnings) == 1, warnings
    [warning] = warnings
    assert warning.startswith(f"a graceful stop may not save its checkpoint in time: {measured}; "), warning
    assert "after the write in flight if any, up to 1 s, more than the 0.6 s of a test (NAME_OF_IT)" in warning
    assert "Fix: a faster volume for output_dir, a longer NAME_OF_IT (over 1 s)" in warning
    assert "a larger checkpoint_every" in warning


@pytest.mark.parametrize("single_use", [True, False], ids=["a-stager-per-save", "one-stager-reused"])
def test_background_saves_survive_a_torch_whose_stager_is_single_use(single_use: bool, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before 2.13, torch's ``DefaultStager._stage`` ends with ``self._state_dict_stager.close()``, which clears the
    copy's dispatch table, so a second ``stage`` fails with ``KeyError: <class 'type'>`` (an H100 with torch 2.11, at
    the second background save). The stand-in stage does what that one does; the writer then needs a stager per save."""
    real_stage = DefaultStager._stage

    def stage_then_close(self: DefaultStager, state_dict: dict, **kwargs: object) -> dict:
        staged = real_stage(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)
    monkeypatch.setattr(distqa.checkpoint.writer, "_STAGER_IS_SINGLE_USE", single_use)
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"))
    with writer.finishing():
        writer.submit({checkpoint_path(tmp_path, 1): a_checkpoint(0.1, 1)})
        if not single_use:  # the stand-in is as strict as torch 2.11: reusing its stager fails as it failed there
            with pytest.raises(KeyError, match="<class 'type'>"):
                writer.submit({checkpoint_path(tmp_path, 2): a_checkpoint(0.1, 2)})
            return
        for step in (2, 3):
            writer.submit({checkpoint_path(tmp_path, step): a_checkpoint(0.1, step)})
    assert [path.name for path in list_checkpoints(tmp_path)] == [f"step-0000000{step}.pt" for step in (1, 2, 3)]
    for path in list_checkpoints(tmp_path):
        verify_checkpoint(path)


def test_a_write_within_the_window_is_one_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = CheckpointWriter(tmp_path, 3, torch.device("cpu"), stop_window=StopWindow(1e6, "a long window", "n/a"))
    with caplog.at_level(logging.INFO, logger="distqa.checkpoint.writer"), writer.finishing():
        writer.submit({checkpoint_path(tmp_path, 1): a_checkpoint(0.1)})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "checkpoint write: step-00000001.pt is 0.1 MB" in caplog.text and "within a long window" in caplog.text


@pytest.mark.parametrize(("environ", "seconds", "named"), [
    ({}, None, None),  # not started by torchrun, no life span: nobody is known to SIGKILL it
    ({"TORCHELASTIC_RUN_ID": "r"}, 30, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),  # torchrun's default
    ({"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}, 90, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
    ({"TORCHELASTIC_RUN_ID": "r", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90", "PET_SHUTDOWN_TIMEOUT": "45"}, 45,
     "PET_SHUTDOWN_TIMEOUT"),  # --shutdown-timeout's variable comes first
    ({"WORKER_STOP_WINDOW_S": "360"}, 360, "WORKER_STOP_WINDOW_S"),
    ({"TORCHELASTIC_RUN_ID": "r", "WORKER_STOP_WINDOW_S": "12"}, 12, "WORKER_STOP_WINDOW_S"),  # the shorter
])
def test_the_stop_window_is_the_shorter_of_torchruns_and_worker_shs(environ: dict[str, str], seconds: float | None,
                                                                    named: str | None) -> None:
    window = graceful_stop_window(environ)
    assert (window.seconds if window else None) == seconds
    assert window is None or f"({named})" in window.what


@pytest.mark.parametrize(("options", "exported"), [(["--life-span", "600"], "60"),
                                                   (["--life-span", "1h", "--stop-after", "50m"], "600"),
                                                   (["--stop-after", "50m"], None), ([], None)])
def test_worker_sh_exports_the_time_between_its_stop_and_the_end_of_the_life_span(
        options: list[str], exported: str | None, tmp_path: Path) -> None:
    """The node in this process up to its agent, whose environment is kept instead of starting it
    (support.processes.node_in_process)."""
    agent_env: dict[str, str] = {}
    result = node_in_process(["--nproc-per-node", "1", *options, "--", "--output-dir", str(tmp_path)], clean_env(),
                             agent_env=agent_env)
    assert result.returncode == 0, result.stderr
    assert agent_env.get("WORKER_STOP_WINDOW_S") == exported
