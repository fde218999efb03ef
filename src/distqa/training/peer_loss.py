"""A lost peer costs at most the step in flight: when a collective fails because another rank is gone (its node
lost, its process killed, or stalled past ``dist_timeout_s``), each surviving rank that holds a complete state of the
last optimizer step saves it as that step's checkpoint before it leaves, and says so in one line. The design, its
limits and its tests: docs/FAULT_TOLERANCE.md, "A lost peer costs one step". In short:

- the state is whole between two optimizer steps: the trainer marks the update (:class:`Survivor`); no rank's random
  state is saved, since every step seeds the generators from (seed, step, rank)
  (:func:`distqa.distributed.rng.seed_for_step`); under NCCL each update first waits for the collectives queued
  before it and checks NCCL's recorded error (:mod:`distqa.distributed.nccl_errors`);
- fsdp: no rank holds the model whole, nothing is saved. hsdp under gloo: the ranks of a node none of whose ranks is
  lost hold every shard of their replica, agree on it over a gloo group of their own that training never uses
  (:class:`ReplicaGroup`, each collective bounded by ``dist_timeout_s``) and write it together as a sharded
  checkpoint (:func:`distqa.checkpoint.sharded.write_shards`), the group's first rank writing what rank 0 writes;
- several survivors: the first to create ``.step-<N>.pt.claim`` (a replica group's first rank:
  ``.step-<N>.dcp.claim``, written through a temporary of the group's own) writes, the others leave it to that rank;
  a write cut short by another failure leaves no file or directory, and the resume takes the newest complete one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch.distributed as dist

from distqa.checkpoint.files import claimed
from distqa.checkpoint.format import verify_checkpoint, verify_directory
from distqa.checkpoint.run_folder import checkpoint_path
from distqa.checkpoint.sharded import sharded_checkpoint_path, shards_of, write_shards
from distqa.config import Config
from distqa.config.errors import PEER_LOST_REPORT, WORKER_REPORT_DIR_VARIABLE
from distqa.distributed.nccl_errors import reported_error
from distqa.distributed.runtime import GLOO_TIMEOUT, CollectiveTimeoutError, Runtime, collective_of, node_local_group
from distqa.training.run_state import RunState

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


class Survivor:
    """What a rank saves after a lost peer: the run's ``state``, when the trainer is not inside an optimizer's update
    (then the last complete step is whole); under hsdp with the ranks of its ``replica_group``."""

    def __init__(self, state: RunState, replica_group: ReplicaGroup | None = None) -> None:
        self.state, self.replica_group = state, replica_group
        self.updating = False
        """Inside the optimizer's update: the weights are neither the last step's nor the next one's."""
        self.progressed = False
        """Whether this process completed a step (:class:`PeerLostError`'s ``progressed``)."""

    def update_begins(self) -> None:
        self.updating = True

    def step_done(self) -> None:
        self.updating, self.progressed = False, True


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


class ReplicaGroup:
    """The ranks of this rank's HSDP replica (its node's), on a gloo group of their own that training never uses:
    after a lost peer its collectives meet no collective of training left half done on another rank. Each is bounded
    by the group's timeout, ``dist_timeout_s``: a rank of it that is gone fails it at once (its connection closed),
    one that stalls within that time."""

    def __init__(self, group: dist.ProcessGroup | None, ranks: list[int]) -> None:
        self.group, self.ranks = group, ranks
        """``group`` None: the replica is this rank alone (one process per node)."""

    @classmethod
    def of(cls, runtime: Runtime, config: Config) -> ReplicaGroup | None:
        """Collective (every rank, in the same order). The replica group of a run whose survivors save with one
        (hsdp under gloo, ``save_on_peer_loss`` on); None for any other."""
        if not (runtime.is_distributed and config.data_parallel == "hsdp" and config.save_on_peer_loss
                and runtime.backend == "gloo"):
            return None
        group, first = node_local_group(runtime, config.dist_timeout_s)
        return cls(group, dist.get_process_group_ranks(group) if group is not None else [first])

    def agree(self, step: int, why_not: str | None) -> str | None:
        """Collective over the group, bounded. None when every rank of it answered that it holds step ``step`` whole;
        else why the group saves nothing (``why_not``: this rank's own reason, or None)."""
        answers = [(step, why_not)]
        if self.group is not None:
            answers = [None] * len(self.ranks)  # type: ignore[list-item]
            try:
                dist.all_gather_object(answers, (step, why_not), group=self.group)
            except RuntimeError as err:  # a rank of the group is gone (or stalled past dist_timeout_s)
                return f"its replica group (ranks {_listed(self.ranks)}) lost a rank too ({_in_a_few_words(err)})"
        return replica_verdict(self.ranks, answers)

    def first_says(self, value: Any) -> Any:
        """Collective over the group, bounded: the group's first rank's ``value`` on every rank of it."""
        if self.group is None:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=self.ranks[0], group=self.group)
        return holder[0]


def replica_verdict(ranks: list[int], answers: list[tuple[int, str | None]]) -> str | None:
    """None when every rank of a replica group (``ranks``, with their ``answers``: the step each completed last, and
    why it does not hold it whole or None) holds the same whole step; else why the group saves nothing."""
    for rank, (_, why_not) in zip(ranks, answers, strict=True):
        if why_not is not None and len(ranks) == 1:
            return why_not
        if why_not is not None:
            return f"rank {rank} of its replica group (ranks {_listed(ranks)}): {why_not}"
    steps = sorted({step for step, _ in answers})
    if len(steps) > 1:
        return f"its replica group (ranks {_listed(ranks)}) holds steps {_listed(steps)}, not one"
    return None


def _listed(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))


def _in_a_few_words(err: BaseException) -> str:
    if (reason := lost_peer(err)) is not None:
        return reason
    if (timed_out := GLOO_TIMEOUT.search(str(err))) is not None:
        return f"gloo: timed out after {int(timed_out[1]) / 1000:g} s"
    return type(err).__name__


def save_what_survives(survivor: Survivor, err: BaseException, reason: str) -> PeerLostError:
    """This rank's one line, once it saved the last complete step (or says why it could not); never raises."""
    state = survivor.state
    rank, step = state.runtime.rank, state.progress.step
    if isinstance(err, CollectiveTimeoutError):
        what = f"collective timeout: {err}"
    else:
        what = f"rank {rank}: lost a peer during {collective_of(err)} after optimizer step {step} ({reason})"
    saved: Path | None = None
    try:
        why_not = _why_not_complete(survivor)
        replica = survivor.replica_group
        if replica is not None:  # hsdp: the ranks of this rank's replica decide, and save, together
            why_not = replica.agree(step, why_not)
        if why_not is not None:
            outcome = f"{why_not}: the resume goes back to the newest checkpoint"
        elif replica is not None:
            saved, outcome = _save_shards(state, replica, step)
        else:
            saved, outcome = _save(state, step)
    except Exception as failure:  # the line is all that is left to say; the previous checkpoint stays
        outcome = f"saving step {step} failed too ({failure!r}): the resume goes back to the newest checkpoint"
    return PeerLostError(f"{what}; {outcome}", saved, progressed=survivor.progressed)


def _why_not_complete(survivor: Survivor) -> str | None:
    config, runtime = survivor.state.config, survivor.state.runtime
    if not config.save_on_peer_loss:
        return "save_on_peer_loss is off"
    if config.data_parallel != "ddp" and survivor.replica_group is None:  # fsdp (hsdp: ReplicaGroup)
        return (f"data_parallel={config.data_parallel} shards the model and its optimizer over the ranks, so "
                "no rank holds it whole")
    if runtime.backend == "nccl" and reported_error() is None:
        # Each update waits for the collectives before it and checks NCCL's recorded error (distqa.distributed.
        # nccl_errors.wait_for_collectives): without that error, an update from partial gradients cannot be ruled out.
        return ("this torch's ProcessGroupNCCL does not report NCCL's errors (get_error), so this rank cannot tell "
                "that its weights are a whole step's")
    if survivor.updating:
        return f"the failure fell inside step {survivor.state.progress.step + 1}'s optimizer update"
    return None


def _save(state: RunState, step: int) -> tuple[Path | None, str]:
    """Write step ``step``'s checkpoint unless it is on disk already or another survivor claimed it."""
    path = checkpoint_path(state.run_dir, step)
    if _saved_already(state.run_dir, step) is None:
        checkpoint = state.training_checkpoint(state.model.state_dict(), state.optimizer.state_dict(), _no_rng(state))
        if checkpoint.save(path, once=True):  # once: another survivor may have written it since the look above
            log.info("saved %s, the last step this rank completed, after a peer was lost", path)
            return path, f"saved step {step} for the resume"
    if (on_disk := _saved_already(state.run_dir, step)) is not None:
        return on_disk, f"step {step} is saved already ({on_disk.name}) for the resume"
    return None, f"another survivor saves step {step} for the resume"


def _saved_already(run_dir: Path, step: int) -> Path | None:
    """Step ``step``'s checkpoint, file or directory, when one is on disk and intact (raises, naming the file, when it
    is damaged)."""
    file, directory = checkpoint_path(run_dir, step), sharded_checkpoint_path(run_dir, step)
    if file.is_file() and verify_checkpoint(file):
        return file
    if directory.is_dir():
        verify_directory(directory)
        return directory
    return None


def _no_rng(state: RunState) -> list[dict[str, Any] | None]:
    """No rank's random state: each step seeds every generator from (seed, step, rank)
    (distqa.distributed.rng.seed_for_step)."""
    return [None] * state.runtime.world_size


def _save_shards(state: RunState, replica: ReplicaGroup, step: int) -> tuple[Path | None, str]:
    """Collective over ``replica``, bounded: its ranks write step ``step``'s sharded checkpoint, each its shards, its
    first rank the rest (``state.pt``, the manifest, the rename), unless the step is on disk already or another replica
    group claimed it. The first rank decides, and says what came of it, for the group."""
    directory = sharded_checkpoint_path(state.run_dir, step)
    first = state.runtime.rank == replica.ranks[0]
    with claimed(directory) if first else contextlib.nullcontext(False) as ours:
        decision = None  # "write", "claimed", or the name of the step's checkpoint on disk
        if first:  # in the claim: a directory renamed into place before is there now
            on_disk = _saved_already(state.run_dir, step)
            decision = on_disk.name if on_disk is not None else "write" if ours else "claimed"
        decision = replica.first_says(decision)
        if decision not in ("write", "claimed"):
            return directory.with_name(decision), f"step {step} is saved already ({decision}) for the resume"
        if decision == "claimed":
            return None, f"another replica group saves step {step} for the resume"
        rest = state.training_checkpoint({}, {}, _no_rng(state)).to_state() if first else None  # weights: the shards
        temporary = directory.with_name(f".{directory.name}.group-{replica.ranks[0]}.tmp")
        written = write_shards(shards_of(state.model, state.optimizer), directory, rest, replica.group,
                               temporary, replace=False)
        kept = replica.first_says(first and written is None)  # the directory was renamed into place meanwhile
    if kept:
        return directory, f"step {step} is saved already ({directory.name}) for the resume"
    if first:
        log.info("saved %s, the last step this replica group completed, after a peer was lost", directory)
    members = f"rank {replica.ranks[0]}" if len(replica.ranks) == 1 else f"ranks {_listed(replica.ranks)}"
    return directory, f"saved step {step} for the resume with its replica group ({members})"
