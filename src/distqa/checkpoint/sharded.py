"""Sharded checkpoints (``checkpoint_format = sharded``): every rank writes its own shards with
``torch.distributed.checkpoint`` (DCP), in the background, into one directory per step.

::

    checkpoints/step-00000100.dcp/
        __0_0.distcp  __1_0.distcp …   each rank's shards of {"model", "optimizer"} (sharded state dicts: the
                                        DTensor slices the rank holds; DCP writes a replicated tensor once)
        .metadata                      DCP's index of the shards (rank 0)
        state.pt                       rank 0: the rest of a TrainingCheckpoint (progress, scheduler, scaler, every
                                       rank's RNG, config, versions, task state, evaluation, world size), its
                                       ``model`` and ``optimizer`` left empty
        manifest.json                  size and CRC-32 of every file above, gathered from the ranks, written last

The promises of the single file hold for the directory as a whole (docs/FAULT_TOLERANCE.md, "Sharded checkpoints",
has each with its test): complete or ignored (the ranks write into ``.step-00000100.dcp.tmp``; once every rank has
finished, the gather of their files' digests being the agreement, rank 0 writes ``state.pt``, then the manifest, and
renames the directory into place); a full disk on any rank fails DCP's save on every rank
(:class:`~distqa.config.errors.DiskFullError`, the temporary removed); damaged shards are found against the manifest
before a resume reads any (:func:`~distqa.checkpoint.format.verify_directory`); pruning counts files and directories
together, by step; the first write goes through the stop deadline's check as a file's does.

The background write is a thread of each rank over a host copy of its shards (the file writer's
:class:`~distqa.checkpoint.writer.BackgroundWrite`), running ``dcp.save`` on a gloo group of its own, so its
collectives never interleave with training's. Why not ``dcp.async_save``: its future ends with the save, and the
digests, the manifest and the rename must follow it on the same thread, in order. ``best.pt`` stays a single file
gathered to rank 0 (:mod:`distqa.checkpoint.writer`): it holds the weights only (no optimizer state), it is what
leaves the cluster (predict, export, the notebook), and it is written only when an evaluation improves. ``predict``,
``evaluate`` and ``export`` also take a step directory (:func:`load_sharded`, in one process).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from distqa.checkpoint.files import OUT_OF_SPACE, atomic_write, file_digest, free_space, fsync_folder
from distqa.checkpoint.format import MANIFEST, STATE_FILE, CheckpointError, ModelCheckpoint, read_sharded
from distqa.checkpoint.run_folder import checkpoint_dir, prune_checkpoints
from distqa.checkpoint.writer import BackgroundWrite, CheckpointWriter
from distqa.config.errors import DiskFullError

log = logging.getLogger(__name__)

SUFFIX = ".dcp"


def sharded_checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step-{step:08d}{SUFFIX}"


def load_sharded(directory: Path) -> ModelCheckpoint:
    """In one process (predict, evaluate, export): the checkpoint in ``directory`` with its whole weights."""
    checkpoint = read_sharded(directory, ModelCheckpoint)
    with warnings.catch_warnings():  # "no process group: loading in this process", which is the point
        warnings.simplefilter("ignore", UserWarning)
        try:
            state = _load_state_dict_from_keys({"model"}, checkpoint_id=str(directory))
        except Exception as err:  # DCP's reader: a foreign or damaged directory, in one line
            raise CheckpointError(f"{directory} holds no readable weights ({type(err).__name__}: {err}).") from err
    return replace(checkpoint, model=state["model"])


def load_model(directory: Path, model: nn.Module) -> None:
    """Collective where a process group exists. The weights in ``directory`` into ``model`` (bare, or sharded by
    :func:`~distqa.distributed.fsdp.shard_model`): DCP reads into each rank's tensors the parts they hold, whatever the
    world size that wrote them."""
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, storage_reader=FileSystemReader(str(directory)))
    set_model_state_dict(model, state["model"])


def load_optimizer(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Collective where a process group exists. The optimizer state in ``directory`` into ``optimizer`` (built over
    ``model`` as training runs it: each rank of a sharded run reads its slices, a replicated one the whole)."""
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, storage_reader=FileSystemReader(str(directory)))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


# --- writing ---------------------------------------------------------------------------------------
class ShardedCheckpointWriter(CheckpointWriter):
    """Every rank's writer: step checkpoints as DCP directories (:meth:`submit_sharded`, collective), ``best.pt`` as
    the file writer writes it (rank 0, :meth:`submit`). Create it on every rank, in the same order (it makes a gloo
    group for the background write)."""

    def __init__(self, run_dir: Path, keep_checkpoints: int, device: torch.device, **kwargs: Any) -> None:
        super().__init__(run_dir, keep_checkpoints, device, **kwargs)
        distributed = dist.is_available() and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        """The background write's collectives (DCP's plan and results, the digests): never those of training."""
        self._shards = BackgroundWrite(self._cuda, "distqa-sharded-writer")
        self._writes.append(self._shards)  # wait() and finishing() complete it before rank 0's files

    def step_path(self, step: int) -> Path:
        return sharded_checkpoint_path(self.run_dir, step)

    def submit_sharded(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                       state: ModelCheckpoint | None) -> Path:
        """Collective. This rank's shards of ``model`` and ``optimizer`` as they are now into step ``step``'s
        directory (returned), with
        ``state`` (rank 0: the rest of the checkpoint; its model and optimizer are not read) beside them. Returns
        once the shards are copied to host memory, after the previous sharded write is complete (its error raised)."""
        self._shards.wait()
        directory = sharded_checkpoint_path(self.run_dir, step)
        shards = shards_of(model, optimizer)
        rest = None if state is None else {**state.to_state(), "model": {}, "optimizer": {}}
        if not self.background:
            self._write_sharded(shards, directory, rest)
            return directory
        self._shards.start(shards, lambda snapshot: self._write_sharded(snapshot, directory, rest))
        return directory

    def _write_sharded(self, shards: dict[str, Any], directory: Path, rest: dict[str, Any] | None) -> None:
        started = time.perf_counter()
        written = write_shards(shards, directory, rest, self.group)
        if written is None:  # not the rank that writes the rest
            return
        seconds, (size, ranks) = time.perf_counter() - started, written
        log.info("saved checkpoint %s (%.1f MB from %d rank(s), %.2f s%s)", directory, size / 1e6, ranks,
                 seconds, ", in the background" if self.background else "")
        if not self._timed:
            self._timed = True
            self._check_deadline(directory, size, seconds)
        prune_checkpoints(self.run_dir, self.keep_checkpoints)


def shards_of(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's part of ``model`` and ``optimizer`` for DCP (sharded state dicts: the DTensor slices it holds, or
    the whole tensors of a replicated model). Local: no collective."""
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


def write_shards(shards: dict[str, Any], directory: Path, rest: dict[str, Any] | None,
                 group: dist.ProcessGroup | None, temporary: Path | None = None,
                 replace: bool = True) -> tuple[int, int] | None:
    """Collective over ``group`` (None: this process alone). Every rank's ``shards`` (:func:`shards_of`) into the
    directory ``temporary`` (default ``.<name>.tmp`` beside ``directory``), then, on the one rank given ``rest`` (the
    rest of the checkpoint, its model and optimizer empty), ``state.pt`` and the manifest, and the rename into
    ``directory``. ``replace``: whether a ``directory`` there already is replaced (the same step written again), or
    kept (the temporary removed). Returns on that rank (bytes, ranks) once written; None on the others and when kept.
    A failure on any rank raises on every rank of the group (DCP gathers each rank's write result), and the rank with
    ``rest`` removes the temporary."""
    temporary = temporary or directory.with_name(f".{directory.name}.tmp")
    rank = dist.get_rank(group) if group is not None else 0  # DCP names each rank's file by its rank in the group
    try:
        try:
            with warnings.catch_warnings():  # one process: "saving in a single process", which is the point
                warnings.simplefilter("ignore", UserWarning)
                dcp.save(shards, storage_writer=FileSystemWriter(str(temporary), sync_files=True),
                         process_group=group, no_dist=group is None)
        except CheckpointException as err:  # every rank gets it: DCP gathers each rank's write result
            raise _disk_full_or(err, temporary) from err
        mine = {path.name: file_digest(path) for path in temporary.glob(f"__{rank}_*")}
        every = [mine]
        if group is not None:
            every = [None] * dist.get_world_size(group)  # type: ignore[list-item]
            dist.all_gather_object(every, mine, group=group)  # the agreement: every rank's shards are durable
        if rest is None:
            return None
        files = {name: digest for digests in every for name, digest in digests.items()}
        files[".metadata"] = file_digest(temporary / ".metadata")
        files[STATE_FILE] = atomic_write(temporary / STATE_FILE, lambda f: torch.save(rest, f))
        text = json.dumps({"files": {name: {"size": d.size, "crc32": d.crc32} for name, d in files.items()}},
                          indent=1, sort_keys=True) + "\n"
        atomic_write(temporary / MANIFEST, lambda f: f.write(text.encode()))  # last: a complete directory
        if directory.exists():
            if not replace:
                shutil.rmtree(temporary)
                return None
            shutil.rmtree(directory)  # the same step written again (a resumed run that stops where it resumed)
        os.replace(temporary, directory)
        fsync_folder(directory.parent)
    except BaseException:
        if rest is not None:  # this rank removes what the ranks wrote
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    return sum(d.size for d in files.values()), len(every)


def _disk_full_or(error: CheckpointException, temporary: Path) -> BaseException:
    """A :class:`DiskFullError` when a rank's write ran out of space (naming the rank), else ``error``."""
    for rank, (failure, _) in sorted(error.failures.items()):
        if isinstance(failure, OSError) and failure.errno in OUT_OF_SPACE:
            return DiskFullError(failure.errno, f"no space left in {temporary.parent} ({free_space(temporary.parent)} "
                                 f"free) while rank {rank} wrote its shards of {temporary.name}; the previous "
                                 "checkpoint is intact. Free space there or write elsewhere")
    return error




def uses_sharded_checkpoints(checkpoint_format: str, data_parallel: str, world_size: int) -> bool:
    """Whether a run writes sharded step checkpoints (``checkpoint_format``; auto: a sharded run of several ranks)."""
    if checkpoint_format == "auto":
        return data_parallel in ("fsdp", "hsdp") and world_size > 1
    return checkpoint_format == "sharded"


def checkpoint_writer(config: Any, world_size: int, run_dir: Path, device: torch.device,
                      **kwargs: Any) -> CheckpointWriter:
    """Collective for the sharded format. The writer of a run: :class:`ShardedCheckpointWriter` on every rank when it
    writes sharded checkpoints, else :class:`~distqa.checkpoint.writer.CheckpointWriter` (rank 0's files)."""
    sharded = uses_sharded_checkpoints(config.checkpoint_format, config.data_parallel, world_size)
    kind = ShardedCheckpointWriter if sharded else CheckpointWriter
    return kind(run_dir, config.keep_checkpoints, device, background=config.checkpoint_in_background, **kwargs)
