"""What a survivor of a lost peer decides, one process, no process group (distqa.training.peer_loss): which failures
are a lost peer, when the state it holds is a whole step, and how two survivors share one checkpoint. The runs that lose
a real peer are in test_elastic.py, test_training.py, test_faults.py and test_hangs.py."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from distqa.checkpoint import sharded
from distqa.checkpoint.format import (
    MANIFEST,
    STATE_FILE,
    Progress,
    TrainingCheckpoint,
    load_checkpoint,
    verify_directory,
)
from distqa.checkpoint.run_folder import checkpoint_path, newest_intact_checkpoint
from distqa.checkpoint.sharded import load_sharded, sharded_checkpoint_path
from distqa.config.sources import load_config
from distqa.distributed import nccl_errors
from distqa.distributed.fsdp import shard_model
from distqa.distributed.nccl_errors import NCCLCollectiveError, survive_nccl_errors, wait_for_collectives
from distqa.distributed.runtime import CollectiveTimeoutError, local_runtime
from distqa.tasks import make_task
from distqa.training import peer_loss
from distqa.training import trainer as trainer_module
from distqa.training.peer_loss import (
    PeerLostError,
    ReplicaGroup,
    Survivor,
    lost_peer,
    replica_verdict,
    save_what_survives,
)
from distqa.training.run_state import RunState

from support.repo import MACHINERY_ARGS

GLOO_RESET = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41823: "
              "Connection reset by peer")


@pytest.mark.parametrize(("message", "reason"), [
    (GLOO_RESET, "gloo: connection reset by peer"),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:589] Connection closed by peer [127.0.0.1]:5000",
     "gloo: connection closed by peer"),
    ("NCCL communicator was aborted on rank 1.", "NCCL: nccl communicator was aborted"),
])
def test_a_peer_gone_is_named_with_its_backend(message: str, reason: str) -> None:
    assert lost_peer(RuntimeError(message)) == reason


def test_other_failures_are_not_a_lost_peer() -> None:
    assert lost_peer(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")) is None
    assert lost_peer(ValueError(GLOO_RESET)) is None  # only the collectives' RuntimeErrors are


def test_a_collective_timeout_is_a_lost_peer() -> None:
    timeout = CollectiveTimeoutError(rank=0, step=3, collective="all_gather", timeout_s=10, world_size=2,
                                     timed_out=[0])
    assert lost_peer(timeout) == "timed out"


def survivor(run_dir: Path, *, rank: int = 1, step: int = 17, backend: str = "gloo", data_parallel: str = "ddp",
             save_on_peer_loss: bool = True, progressed: bool = True) -> Survivor:
    """A survivor of a run's state (as a Trainer holds it) with a real model, optimizer and scheduler, after
    ``progressed``: whether this process completed a step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    settings = {"seed": 1, "data_parallel": data_parallel}
    state = RunState(
        runtime=SimpleNamespace(rank=rank, world_size=3, backend=backend), run_dir=run_dir,  # type: ignore[arg-type]
        progress=Progress(step=step, seeds_per_step=True),
        config=SimpleNamespace(data_parallel=data_parallel, save_on_peer_loss=save_on_peer_loss,  # type: ignore[arg-type]
                               to_dict=lambda: dict(settings)),
        model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        precision=SimpleNamespace(scaler=torch.amp.GradScaler("cpu", enabled=False)))  # type: ignore[arg-type]
    survived = Survivor(state)
    if progressed:  # as the trainer marks a step it completed in this process
        survived.update_begins()
        survived.step_done()
    return survived


def test_a_ddp_survivor_saves_the_step_it_completed(tmp_path: Path) -> None:
    trainer = survivor(tmp_path)
    err = save_what_survives(trainer, RuntimeError(GLOO_RESET), "gloo: connection reset by peer")
    assert isinstance(err, PeerLostError) and err.progressed
    assert str(err) == ("rank 1: lost a peer during a collective after optimizer step 17 (gloo: connection reset by "
                        "peer); saved step 17 for the resume")
    saved = load_checkpoint(checkpoint_path(tmp_path, 17))
    assert err.saved == checkpoint_path(tmp_path, 17)
    assert saved.progress.step == 17 and saved.saved_by_rank == 1 and saved.rng == [None, None, None]
    assert torch.equal(saved.model["weight"], trainer.state.model.weight.detach())
    assert saved.optimizer["state"][0]["step"] == trainer.state.optimizer.state_dict()["state"][0]["step"]
    assert not list(tmp_path.glob("checkpoints/.*claim")), "the claim is released"


def test_a_second_survivor_leaves_the_step_to_the_first(tmp_path: Path) -> None:
    save_what_survives(survivor(tmp_path, rank=1), RuntimeError(GLOO_RESET), "gloo")
    written = checkpoint_path(tmp_path, 17).stat().st_mtime_ns
    err = save_what_survives(survivor(tmp_path, rank=0), RuntimeError(GLOO_RESET), "gloo")
    assert str(err).endswith("step 17 is saved already (step-00000017.pt) for the resume")
    assert checkpoint_path(tmp_path, 17).stat().st_mtime_ns == written


def test_a_survivor_that_claims_the_step_just_after_the_first_released_it_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two survivors race: rank 0 looks (nothing on disk yet), rank 1 claims, writes and releases, then rank 0 takes
    the claim. It finds the file written and leaves it: exactly one survivor says it saved the step."""
    first_look = peer_loss._saved_already

    def the_other_writes_meanwhile(run_dir: Path, step: int) -> Path | None:
        found = first_look(run_dir, step)
        if found is None and not checkpoint_path(tmp_path, 17).exists():  # rank 0's first look, before rank 1 writes
            monkeypatch.setattr(peer_loss, "_saved_already", first_look)
            assert str(save_what_survives(survivor(tmp_path, rank=1), RuntimeError(GLOO_RESET), "gloo")).endswith(
                "saved step 17 for the resume")
        return found

    monkeypatch.setattr(peer_loss, "_saved_already", the_other_writes_meanwhile)
    err = save_what_survives(survivor(tmp_path, rank=0), RuntimeError(GLOO_RESET), "gloo")
    assert str(err).endswith("step 17 is saved already (step-00000017.pt) for the resume"), str(err)
    assert load_checkpoint(checkpoint_path(tmp_path, 17)).saved_by_rank == 1, "rank 1's file stays as it wrote it"


def test_a_survivor_whose_peer_holds_the_claim_writes_nothing(tmp_path: Path) -> None:
    claim = checkpoint_path(tmp_path, 17).with_name(".step-00000017.pt.claim")
    claim.parent.mkdir(parents=True)
    claim.write_text("another survivor\n")
    err = save_what_survives(survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    assert str(err).endswith("another survivor saves step 17 for the resume") and err.saved is None
    assert not checkpoint_path(tmp_path, 17).exists()


@pytest.mark.parametrize(("change", "why"), [
    ({"data_parallel": "fsdp"}, "data_parallel=fsdp shards the model and its optimizer over the ranks"),
    # hsdp without a replica group: under NCCL (ReplicaGroup.of makes one under gloo only)
    ({"data_parallel": "hsdp", "backend": "nccl"},
     "data_parallel=hsdp shards the model and its optimizer over the ranks"),
    ({"save_on_peer_loss": False}, "save_on_peer_loss is off"),
    ({"updating": True}, "the failure fell inside step 18's optimizer update"),
])
def test_a_survivor_without_a_whole_step_saves_nothing_and_says_why(tmp_path: Path, change: dict[str, Any],
                                                                     why: str) -> None:
    updating = change.pop("updating", False)
    trainer = survivor(tmp_path, **change)
    if updating:
        trainer.update_begins()
    err = save_what_survives(trainer, RuntimeError(GLOO_RESET), "gloo")
    assert why in str(err) and str(err).endswith(": the resume goes back to the newest checkpoint")
    assert err.saved is None and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(("reported", "saved"), [("SUCCESS", True), (None, False)])
def test_an_nccl_survivor_saves_its_step_only_where_nccl_reports_its_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reported: str | None, saved: bool) -> None:
    """Under NCCL every update waited for the collectives before it and for NCCL's recorded error
    (nccl_errors.wait_for_collectives), so a survivor's weights are a whole step's. A torch whose ProcessGroupNCCL
    reports no error state leaves that open: such a survivor saves nothing and says why."""
    monkeypatch.setattr(peer_loss, "reported_error", lambda: reported)
    failure = NCCLCollectiveError("NCCL communicator was aborted (REMOTE_ERROR) before optimizer step 18's update")
    err = save_what_survives(survivor(tmp_path, backend="nccl"), failure, lost_peer(failure) or "")
    assert str(err).startswith("rank 1: lost a peer during a collective after optimizer step 17 (NCCL: nccl "
                               "communicator was aborted)")
    assert (err.saved == checkpoint_path(tmp_path, 17)) is saved
    if not saved:
        assert "does not report NCCL's errors (get_error)" in str(err)


class GPUQueue:
    """torch.cuda.Event as wait_for_collectives uses it: recorded, then done after ``busy`` queries (None: never)."""

    def __init__(self, busy: int | None) -> None:
        self.busy, self.queries = busy, 0

    def __call__(self) -> GPUQueue:
        return self

    def record(self) -> None:
        pass

    def query(self) -> bool:
        self.queries += 1
        return self.busy is not None and self.queries > self.busy


NCCL_RUNTIME = SimpleNamespace(backend="nccl")


def test_the_wait_before_an_update_is_nccl_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu() -> None:
        raise AssertionError("gloo raises where the collective is called: no wait, no CUDA call")

    monkeypatch.setattr(torch.cuda, "Event", no_gpu)
    wait_for_collectives(SimpleNamespace(backend="gloo"), 10, 17)  # type: ignore[arg-type]


def test_an_update_waits_for_the_gpu_then_for_nccls_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = GPUQueue(busy=3)
    monkeypatch.setattr(torch.cuda, "Event", queue)
    monkeypatch.setattr(nccl_errors, "reported_error", lambda: "SUCCESS")
    wait_for_collectives(NCCL_RUNTIME, 10, 17)  # type: ignore[arg-type]
    assert queue.queries == 4, "it returns only once the GPU has run what was queued"

    monkeypatch.setattr(torch.cuda, "Event", GPUQueue(busy=0))
    monkeypatch.setattr(nccl_errors, "reported_error", lambda: "REMOTE_ERROR")
    with pytest.raises(NCCLCollectiveError, match=r"aborted \(REMOTE_ERROR\) before optimizer step 18's update") as err:
        wait_for_collectives(NCCL_RUNTIME, 10, 17)  # type: ignore[arg-type]
    assert lost_peer(err.value) == "NCCL: nccl communicator was aborted", "a lost peer: the survivor's path"


def test_a_wait_that_nccls_watchdog_never_ends_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", GPUQueue(busy=None))
    monkeypatch.setattr(nccl_errors, "WATCHDOG_GRACE_S", 0.05)
    with pytest.raises(NCCLCollectiveError, match=r"did not finish within 0\.05 s"):
        wait_for_collectives(NCCL_RUNTIME, 0, 17)  # type: ignore[arg-type]


def test_save_on_peer_loss_has_nccls_watchdog_abort_the_collective_not_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # what worker.sh exports: the watchdog ends the process
    survive_nccl_errors()
    assert nccl_errors.os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"


def test_the_step_waits_for_the_collectives_before_its_update_is_marked_or_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Trainer.train_step: the wait comes after backward (the gradients' all-reduce queued) and before the update
    mark, so a failure there leaves the weights and the mark as the last complete step left them."""
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    seen: list[bool] = []

    def the_peer_is_gone(runtime: Any, timeout_s: float, step: int) -> None:
        seen.append(trainer.survivor.updating)
        raise NCCLCollectiveError("NCCL communicator was aborted (TIMEOUT) before optimizer step 18's update")

    monkeypatch.setattr(trainer_module, "wait_for_collectives", the_peer_is_gone)
    metrics = SimpleNamespace(start_step=lambda: None, count_batch=lambda batch, rows=None: None,
                              local_work_done=lambda: None)
    trainer = SimpleNamespace(
        runtime=SimpleNamespace(device=torch.device("cpu"), is_distributed=False), metrics=metrics,
        plan=SimpleNamespace(accumulation=1, real_rows=()), ddp_model=model, autocast=contextlib.nullcontext,
        model=model,
        task=SimpleNamespace(input_names=["input"], loss=lambda output, batch: output.sum()),
        precision=SimpleNamespace(scaler=torch.amp.GradScaler("cpu", enabled=False)), optimizer=optimizer,
        config=SimpleNamespace(max_grad_norm=0, save_on_peer_loss=True, dist_timeout_s=10, per_rank_batch_size=2),
        progress=Progress(step=17))
    trainer.survivor = Survivor(trainer)
    with pytest.raises(NCCLCollectiveError):
        trainer_module.Trainer.train_step(trainer, iter([{"input": torch.ones(2, 3)}]))  # type: ignore[arg-type]
    assert seen == [False] and not trainer.survivor.updating
    assert model.weight.grad is not None and torch.equal(model.weight.detach(), before), "no update was made"


def test_a_failed_save_is_one_line_and_leaves_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the folder goes\n")
    err = save_what_survives(survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    assert "saving step 17 failed too (" in str(err) and "\n" not in str(err) and err.saved is None


def test_only_a_rank_that_progressed_reports_a_membership_change(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 76 and the agent's report for a rank that completed a step in this start; exit 1 (a restart spent)
    for one that did not, so that a node failing at every start cannot hold the others in restarts for ever."""
    reports = tmp_path / "reports"
    reports.mkdir()
    monkeypatch.setenv("WORKER_STOP_REPORT_DIR", str(reports))
    stuck = save_what_survives(survivor(tmp_path / "a", progressed=False), RuntimeError(GLOO_RESET), "gloo")
    assert stuck.exit_code(rank=1) == 1 and not list(reports.iterdir())
    moved = save_what_survives(survivor(tmp_path / "b"), RuntimeError(GLOO_RESET), "gloo")
    assert moved.exit_code(rank=1) == 76
    assert (reports / "peer-lost-rank-1").read_text() == f"{moved}\n"


def test_the_stop_signals_stay_handled_while_a_survivor_saves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent sees the lost peer too and sends the survivors SIGTERM: during the save it is recorded, not the
    default action that would end the save half written (found beside two CPU hogs: rank 0 died with only its
    .step-N.pt.tmp and claim written, and the resume went back to the newest checkpoint)."""
    handlers = []

    def save(survivor: Any, err: BaseException, reason: str) -> Exception:
        handlers.append(signal.getsignal(signal.SIGTERM))
        return PeerLostError("saved", None, progressed=True)

    def lose_the_peer(*_: Any) -> bool:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")

    monkeypatch.setattr(trainer_module, "save_what_survives", save)
    runtime = SimpleNamespace(device=torch.device("cpu"), is_distributed=True, is_main_process=False, rank=1,
                              world_size=2)
    fake = SimpleNamespace(
        _log_plan=lambda: None, _already_done=lambda: False, runtime=runtime, progress=Progress(step=3),
        config=SimpleNamespace(stop_check_every=1, progress_bar=False), plan=SimpleNamespace(total_steps=10),
        checkpoints=SimpleNamespace(finishing=contextlib.nullcontext), _train_epoch=lose_the_peer, survivor=None)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(PeerLostError, match="saved"):
        trainer_module.Trainer.fit(fake, SimpleNamespace(writer=None))  # type: ignore[arg-type]
    assert len(handlers) == 1 and handlers[0] not in (signal.SIG_DFL, before), handlers
    assert getattr(handlers[0], "__self__", None).__class__.__name__ == "StopSignal"
    assert signal.getsignal(signal.SIGTERM) == before, "the handlers before the loop come back after it"


# --- hsdp: a whole replica group saves ---------------------------------------------------------------
@pytest.mark.parametrize(("ranks", "answers", "verdict"), [
    ([0, 1], [(17, None), (17, None)], None),
    ([2, 3], [(17, None), (17, "the failure fell inside step 18's optimizer update")],
     "rank 3 of its replica group (ranks 2, 3): the failure fell inside step 18's optimizer update"),
    ([0, 1], [(17, None), (18, None)], "its replica group (ranks 0, 1) holds steps 17, 18, not one"),
    ([4], [(17, "the failure fell inside step 18's optimizer update")],
     "the failure fell inside step 18's optimizer update"),
])
def test_a_replica_group_saves_only_when_each_of_its_ranks_holds_the_same_whole_step(
        ranks: list[int], answers: list[tuple[int, str | None]], verdict: str | None) -> None:
    assert replica_verdict(ranks, answers) == verdict


@pytest.mark.parametrize(("error", "said"), [
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:589] Connection closed by peer [127.0.0.1]:5000",
     "gloo: connection closed by peer"),
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 60000ms for recv operation to "
     "complete", "gloo: timed out after 60 s"),
])
def test_a_replica_group_that_lost_a_rank_saves_nothing_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str, said: str) -> None:
    """The group's exchange fails as gloo fails it (the other rank gone: its connection closed at once; stalled: after
    the group's timeout, dist_timeout_s): no rank of it saves."""
    def gloo_fails(*_: Any, **__: Any) -> None:
        raise RuntimeError(error)

    monkeypatch.setattr(torch.distributed, "all_gather_object", gloo_fails)
    trainer = survivor(tmp_path, rank=2, data_parallel="hsdp")
    trainer.replica_group = ReplicaGroup(group=object(), ranks=[2, 3])  # type: ignore[arg-type]
    err = save_what_survives(trainer, RuntimeError(GLOO_RESET), "gloo: connection reset by peer")
    assert str(err).endswith(f"; its replica group (ranks 2, 3) lost a rank too ({said}): the resume goes back to the "
                             "newest checkpoint"), str(err)
    assert err.saved is None and not (tmp_path / "checkpoints").exists()


def hsdp_survivor(run_dir: Path, rank: int = 0) -> Any:
    """:func:`survivor` with the bag of words of the machinery task sharded by hsdp on this process's 1 × 1 mesh, after
    an optimizer step, and its replica group of one (one process per node: no group to talk over)."""
    config = load_config([*MACHINERY_ARGS, "--data-parallel", "hsdp"], environ={}, dotenv_path=os.devnull)
    task = make_task(config)
    torch.manual_seed(0)
    model = task.build_model()
    shard_model(model, task.sharding_units(model), local_runtime("cpu"), config, None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[1, 2, 3]]), attention_mask=torch.ones(1, 3, dtype=torch.long)).sum().backward()
    optimizer.step()
    trainer = survivor(run_dir, rank=rank, data_parallel="hsdp")
    trainer.state.model, trainer.state.optimizer, trainer.replica_group = model, optimizer, ReplicaGroup(None, [rank])
    trainer.state.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return trainer


def test_a_whole_replica_group_saves_its_step_as_a_sharded_checkpoint(tmp_path: Path, group_of_one: None) -> None:
    """The weights and optimizer state a replica's ranks hold go into step-17.dcp (DCP, what the sharded writer
    writes: shards, state.pt, the manifest last), which verifies and reads back whole; a second group finds it
    saved."""
    trainer = hsdp_survivor(tmp_path)
    err = save_what_survives(trainer, RuntimeError(GLOO_RESET), "gloo: connection reset by peer")
    directory = sharded_checkpoint_path(tmp_path, 17)
    assert str(err).endswith("; saved step 17 for the resume with its replica group (rank 0)"), str(err)
    assert err.saved == directory and err.progressed
    verify_directory(directory)
    assert sorted(p.name for p in directory.iterdir()) == [".metadata", "__0_0.distcp", MANIFEST, STATE_FILE]
    saved = load_sharded(directory)
    whole = get_model_state_dict(trainer.state.model, options=StateDictOptions(full_state_dict=True))
    assert saved.model.keys() == whole.keys()
    assert all(torch.equal(saved.model[name], whole[name]) for name in whole)
    state = torch.load(directory / STATE_FILE, weights_only=True)
    assert state["progress"]["step"] == 17 and state["rng"] == [None] * 3 and state["model"] == {}
    assert not list((tmp_path / "checkpoints").glob(".*")), "no claim or temporary left"
    again = save_what_survives(hsdp_survivor(tmp_path, rank=2), RuntimeError(GLOO_RESET), "gloo")
    assert str(again).endswith("; step 17 is saved already (step-00000017.dcp) for the resume")


def test_a_replica_group_leaves_a_step_another_group_claimed(tmp_path: Path, group_of_one: None) -> None:
    claim = sharded_checkpoint_path(tmp_path, 17).with_name(".step-00000017.dcp.claim")
    claim.parent.mkdir(parents=True)
    claim.write_text("another replica group\n")
    err = save_what_survives(hsdp_survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    assert str(err).endswith("; another replica group saves step 17 for the resume") and err.saved is None
    assert sorted(p.name for p in claim.parent.iterdir()) == [claim.name]


def test_a_replica_group_leaves_a_step_saved_as_a_file_as_it_is(tmp_path: Path, group_of_one: None) -> None:
    """Step 17 written as a file already (rank 0's write of a run with checkpoint_format file, here a DDP survivor's
    save): the replica writes no directory beside it."""
    save_what_survives(survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    err = save_what_survives(hsdp_survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    assert str(err).endswith("; step 17 is saved already (step-00000017.pt) for the resume")
    assert err.saved == checkpoint_path(tmp_path, 17) and not sharded_checkpoint_path(tmp_path, 17).exists()


def test_a_replica_group_save_cut_short_leaves_no_checkpoint(tmp_path: Path, group_of_one: None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest's write fails (as a kill there would end it): no step-17.dcp, no temporary, the claim released; the
    resume takes the newest complete checkpoint, here none."""
    write = sharded.atomic_write

    def no_manifest(path: Path, *args: Any) -> Any:
        if path.name == MANIFEST:
            raise OSError(28, "No space left on device")
        return write(path, *args)

    monkeypatch.setattr(sharded, "atomic_write", no_manifest)
    err = save_what_survives(hsdp_survivor(tmp_path), RuntimeError(GLOO_RESET), "gloo")
    assert "; saving step 17 failed too (OSError(28, 'No space left on device')): the resume goes back" in str(err)
    assert err.saved is None and not list((tmp_path / "checkpoints").iterdir())
    assert newest_intact_checkpoint(tmp_path, TrainingCheckpoint) is None
