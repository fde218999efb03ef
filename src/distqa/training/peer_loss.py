"""A lost peer costs at most the step in flight: when a collective fails because another rank is gone (its node
lost, its process killed, or stalled past ``dist_timeout_s``), each surviving rank that holds a complete state of
the last optimizer step saves it as that step's checkpoint before it leaves, and says so in one line
(docs/FAULT_TOLERANCE.md, "A lost peer").

Under DDP every rank holds the whole model, optimizer, scheduler and scaler, and the sampler's position. The state is
complete between two optimizer steps: the trainer marks where it is (:class:`LastCompleteStep`). A failure inside a
step's forward or backward (DDP's gradient all-reduce) leaves the model as the previous step made it; a failure in a
step's bookkeeping (its log line's gather, the evaluation, the checkpoint's gather, the stop check) leaves that
step's state whole. The random generators need no saving: every step seeds them from (seed, step, rank)
(:func:`distqa.distributed.rng.seed_for_step`), so the resume draws what the lost ranks would have drawn, and the run
ends with the weights of one never interrupted, dropout included. Only the optimizer's update itself is no place to save
from. Under NCCL the GPU runs behind the host, so each update first waits for the collectives queued before it and
checks the error NCCL's watchdog recorded (:mod:`distqa.distributed.nccl_errors`): no update is made from gradients a
lost peer left partial. A sharded model (fsdp, hsdp) is not whole on any rank: those runs go back to the newest
checkpoint, and the line says so.

Survivors write in parallel without clobbering one another, or rank 0's own write of the same step: the first to
create ``.step-<N>.pt.claim`` writes the file (atomically, with its CRC sidecar: :func:`distqa.atomic_files.claimed`),
the others leave it to that rank.
A write cut short by another failure leaves no file, and the resume takes the newest complete one.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distqa.checkpoint.format import TrainingCheckpoint, verify_checkpoint
from distqa.checkpoint.run_folder import checkpoint_path
from distqa.distributed.nccl_errors import reported_error
from distqa.distributed.runtime import CollectiveTimeoutError, collective_of
from distqa.errors import PEER_LOST_REPORT, WORKER_REPORT_DIR_VARIABLE
from distqa.record.rundir import versions

if TYPE_CHECKING:
    from distqa.training.trainer import Trainer

log = logging.getLogger(__name__)

PEER_LOST_EXIT_CODE = 76
"""A worker that left because a peer was lost (after saving what it held): torchrun restarts the workers into a
new rendezvous round, the one without the lost node (or with it, when it returns)."""
PEER_GONE = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|Connection refused|"
                       r"NCCL communicator was aborted|ncclRemoteError|ncclSystemError|remote process exited|"
                       r"Socket Timeout|connection closed", re.IGNORECASE)
"""What gloo (gloo/transport/tcp/pair.cc) and NCCL say when the other end of a collective is gone."""


class PeerLostError(Exception):
    """This rank left because a peer was lost: one line, what it saved for the resume included. ``progressed``:
    whether this process completed a step before (a peer lost before any only spends a restart, so that a node that
    keeps failing cannot hold the others in restarts for ever)."""

    def __init__(self, line: str, saved: Path | None, progressed: bool) -> None:
        super().__init__(line)
        self.saved, self.progressed = saved, progressed

    def exit_code(self, rank: int) -> int:
        """76, reported to the agent as a membership change, for a rank that progressed; 1 otherwise."""
        folder = os.environ.get(WORKER_REPORT_DIR_VARIABLE)
        if not self.progressed:
            return 1
        if folder and Path(folder).is_dir():
            (Path(folder) / PEER_LOST_REPORT.format(rank=rank)).write_text(f"{self}\n")
        return PEER_LOST_EXIT_CODE


class LastCompleteStep:
    """Where the trainer is: inside an optimizer's update, or not (then the last complete step is whole)."""

    def __init__(self) -> None:
        self.updating = False
        """Inside the optimizer's update: the weights are neither the last step's nor the next one's."""

    def update_begins(self) -> None:
        self.updating = True

    def step_done(self) -> None:
        self.updating = False


def lost_peer(err: BaseException) -> str | None:
    """Why the collective failed, in a few words, when a peer is gone or stalled (None: another error)."""
    if isinstance(err, CollectiveTimeoutError):
        return "timed out"
    if isinstance(err, RuntimeError):  # torch.distributed.DistError and DistBackendError are RuntimeErrors
        found = PEER_GONE.search(str(err))
        if found:
            backend = "NCCL" if "nccl" in str(err).lower() else "gloo"
            return f"{backend}: {found.group(0).lower()}"
    return None


def save_what_survives(trainer: Trainer, err: BaseException, reason: str) -> PeerLostError:
    """This rank's one line, once it saved the last complete step (or says why it could not); never raises."""
    rank, step = trainer.runtime.rank, trainer.progress.step
    if isinstance(err, CollectiveTimeoutError):
        what = f"collective timeout: {err}"
    else:
        what = f"rank {rank}: lost a peer during {collective_of(err)} after optimizer step {step} ({reason})"
    saved: Path | None = None
    try:
        why_not = _why_not_complete(trainer)
        if why_not is not None:
            outcome = f"{why_not}: the resume goes back to the newest checkpoint"
        else:
            saved, outcome = _save(trainer, step)
    except Exception as failure:  # the line is all that is left to say; the previous checkpoint stays
        outcome = f"saving step {step} failed too ({failure!r}): the resume goes back to the newest checkpoint"
    return PeerLostError(f"{what}; {outcome}", saved, progressed=trainer.progress.step > trainer.first_step)


def _why_not_complete(trainer: Trainer) -> str | None:
    if not trainer.config.save_on_peer_loss:
        return "save_on_peer_loss is off"
    if trainer.config.data_parallel != "ddp":
        return (f"data_parallel={trainer.config.data_parallel} shards the model and its optimizer over the ranks, so "
                "no rank holds it whole")
    if trainer.runtime.backend == "nccl" and reported_error() is None:
        # Each update waits for the collectives before it and checks NCCL's recorded error (distqa.distributed.
        # nccl_errors.wait_for_collectives): without that error, an update from partial gradients cannot be ruled out.
        return ("this torch's ProcessGroupNCCL does not report NCCL's errors (get_error), so this rank cannot tell "
                "that its weights are a whole step's")
    if trainer.survivable.updating:
        return f"the failure fell inside step {trainer.progress.step + 1}'s optimizer update"
    return None


def _save(trainer: Trainer, step: int) -> tuple[Path | None, str]:
    """Write step ``step``'s checkpoint unless it is on disk already or another survivor claimed it."""
    path = checkpoint_path(trainer.run_dir, step)
    if path.is_file() and verify_checkpoint(path):
        return path, f"step {step} is saved already ({path.name}) for the resume"
    rank = trainer.runtime.rank
    # No rank's random state: each step seeds every generator from (seed, step, rank)
    # (distqa.distributed.rng.seed_for_step).
    rng: list[dict[str, Any] | None] = [None] * trainer.runtime.world_size
    checkpoint = TrainingCheckpoint(
        model=trainer.model.state_dict(), config=trainer.config.to_dict(), task_state=trainer.task_state,
        evaluation=trainer.evaluation, progress=trainer.progress, versions=versions(),
        optimizer=trainer.optimizer.state_dict(), scheduler=trainer.scheduler.state_dict(),
        scaler=trainer.precision.scaler.state_dict(), rng=rng, world_size=trainer.runtime.world_size,
        saved_by_rank=rank)
    if not checkpoint.save(path):
        return None, f"another survivor saves step {step} for the resume"
    log.info("saved %s, the last step this rank completed, after a peer was lost", path)
    return path, f"saved step {step} for the resume"
