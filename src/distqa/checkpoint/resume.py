"""Resume: rank 0 picks the checkpoint, one rank per node reads it, and every rank loads it into its objects.

Reading a checkpoint from shared storage once per rank (64 reads of a 5 GB file at 64 GPUs) costs what the
storage can serve, whatever the node count; here each node reads it once:

- rank 0 picks the file (``--resume auto``: the newest that verifies,
  :func:`~distqa.checkpoint.run_folder.newest_intact_checkpoint`; or ``--resume PATH``) and reads it once, its size and
  CRC-32 checked in the same pass;
- the first rank of each other node reads the same file once, verified the same way (a node that cannot
  read it, or reads other bytes, stops every rank with one line naming the node: ``output_dir`` must be
  storage every node sees);
- the other ranks of a node receive the bytes from its first rank over a node-local gloo group
  (:func:`~distqa.distributed.runtime.node_local_group`: memory to memory, a binomial tree, so the first rank sends
  at most log2(ranks per node) copies, and storage sees one read per node whatever the ranks per node).

Every rank then loads the bytes into its bare model (:func:`resume`, before the DDP wrap or the sharding) and,
once the optimizer is built over the wrapped model, into the optimizer, scheduler, scaler and its own RNG streams
(:func:`restore_training_state`; a sharded run's ranks keep their slices of the optimizer state). Each rank
holds the file's bytes in memory until it has loaded them (the price of not reading it again).
"""

from __future__ import annotations

import logging
import mmap
import time
from pathlib import Path

import torch
from torch import nn

from distqa.checkpoint.format import (
    CheckpointError,
    TrainingCheckpoint,
    is_sharded_checkpoint,
    parse_checkpoint,
    read_checkpoint,
    read_sharded,
    sharded_directory,
)
from distqa.checkpoint.run_folder import newest_intact_checkpoint, remove_stale_temporaries
from distqa.checkpoint.sharded import load_model, load_optimizer
from distqa.config import Config, ConfigError
from distqa.distributed.fsdp import load_optimizer_state
from distqa.distributed.precision import Precision
from distqa.distributed.rng import restore_rng_state, seed_everything
from distqa.distributed.runtime import Runtime, all_gather_objects, broadcast_buffer, broadcast_object, node_local_group

log = logging.getLogger(__name__)


def resume(config: Config, runtime: Runtime, run_dir: Path, model: nn.Module) -> TrainingCheckpoint | None:
    """Collective. The checkpoint named by ``config.resume``, its weights loaded into the bare ``model``; None
    when the run starts from scratch. Call it before the DDP wrap or the sharding (both take rank 0's weights
    as they are then), and :func:`restore_training_state` once the optimizer is built over the wrapped model."""
    chosen, problem, data, checkpoint = None, None, None, None
    if runtime.is_main_process:
        for stale in remove_stale_temporaries(run_dir):
            log.info("removed %s, left by an interrupted checkpoint write", stale)
        # Rank 0 chooses, so that a damaged file is skipped (auto) or refused (a given path) by every rank alike.
        try:
            if config.resume == "auto":
                found = newest_intact_checkpoint(run_dir, TrainingCheckpoint)
                if found:
                    chosen, checkpoint, data = str(found.path), found.checkpoint, found.data
            elif config.resume != "none" and is_sharded_checkpoint(Path(config.resume)):
                chosen, checkpoint = config.resume, read_sharded(Path(config.resume), TrainingCheckpoint)
            elif config.resume != "none":
                chosen = config.resume
                data = read_checkpoint(Path(chosen))
                checkpoint = parse_checkpoint(data, chosen, TrainingCheckpoint)
        except CheckpointError as err:
            problem = str(err)
            if data is not None:
                data.close()
    chosen, problem, size = broadcast_object((chosen, problem, len(data) if data is not None else 0))
    if problem is not None:
        raise ConfigError(f"cannot resume from {chosen}: {problem}\nUse --resume none or another "
                          "--run-name to start fresh.")
    if chosen is None:
        log.info("starting from scratch (no checkpoint to resume)")
        return None
    directory = broadcast_object(chosen if runtime.is_main_process and sharded_directory(checkpoint.model) else None)
    if directory is not None:  # verified by rank 0; every rank reads its part of the shards
        return resume_sharded(Path(directory), broadcast_object(checkpoint), config, model)
    data = read_once_per_node(Path(chosen), size, runtime, config.dist_timeout_s, data)
    try:
        if checkpoint is None:
            checkpoint = parse_checkpoint(data, chosen, TrainingCheckpoint)
        config.refuse_another_run(checkpoint.config, chosen)
        model.load_state_dict(checkpoint.model)
    except (CheckpointError, RuntimeError) as err:
        raise ConfigError(f"cannot resume from {chosen}: {err}\nUse --resume none or another "
                          "--run-name to start fresh.") from err
    finally:
        data.close()
    log.info("resumed from %s at step %d (epoch %d, %d examples into it)", chosen, checkpoint.progress.step,
             checkpoint.progress.epoch, checkpoint.progress.samples_in_epoch)
    return checkpoint


def restore_training_state(checkpoint: TrainingCheckpoint, config: Config, runtime: Runtime, model: nn.Module,
                           optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                           precision: Precision) -> None:
    """Collective for a sharded model. The rest of :func:`resume`'s ``checkpoint`` into the optimizer (built over
    ``model`` as training runs it: replicated or sharded, :func:`distqa.distributed.fsdp.load_optimizer_state`), the
    scheduler, the scaler and this rank's random generators."""
    directory = sharded_directory(checkpoint.optimizer)
    if directory is not None:
        load_optimizer(directory, model, optimizer)
    else:
        load_optimizer_state(model, optimizer, checkpoint.optimizer)
    scheduler.load_state_dict(checkpoint.scheduler)
    precision.scaler.load_state_dict(checkpoint.scaler)
    # Each step seeds the generators from (seed, step, rank) (distqa.distributed.rng.seed_for_step): what a checkpoint
    # holds of them matters only before the first step (a survivor's save after a lost peer holds none).
    if len(checkpoint.rng) == runtime.world_size and checkpoint.rng[runtime.rank] is not None:
        restore_rng_state(checkpoint.rng[runtime.rank])
    else:
        if len(checkpoint.rng) != runtime.world_size:  # the data order still resumes exactly; the masks differ
            log.warning("checkpoint came from world size %d, now %d: each step's dropout masks are drawn for this "
                        "world size's ranks", len(checkpoint.rng), runtime.world_size)
        seed_everything(config.seed + 1000 * runtime.rank + checkpoint.progress.step)


def resume_sharded(directory: Path, checkpoint: TrainingCheckpoint, config: Config,
                   model: nn.Module) -> TrainingCheckpoint:
    """Collective. :func:`resume` from a sharded checkpoint (``checkpoint``: its state without the weights, which
    rank 0 verified): every rank reads the whole weights into its bare model (DCP, at any world size)."""
    try:
        config.refuse_another_run(checkpoint.config, str(directory))
        load_model(directory, model)
    except (CheckpointError, RuntimeError, ValueError) as err:
        raise ConfigError(f"cannot resume from {directory}: {err}\nUse --resume none or another "
                          "--run-name to start fresh.") from err
    log.info("resumed from %s at step %d (epoch %d, %d examples into it; written by %d rank(s))", directory,
             checkpoint.progress.step, checkpoint.progress.epoch, checkpoint.progress.samples_in_epoch,
             checkpoint.world_size)
    return checkpoint


def read_once_per_node(path: Path, size: int, runtime: Runtime, timeout_s: float,
                       data: mmap.mmap | None) -> mmap.mmap:
    """Collective. The bytes of ``path`` (``size`` of them, as rank 0 read them) on every rank: ``data`` where
    this rank has read them already (rank 0), else read by the first rank of each node and sent to the others
    of its node. Raises :class:`ConfigError` on every rank, naming the node, when a node cannot read them."""
    group, first = node_local_group(runtime, timeout_s)
    problem = None
    if runtime.rank == first and data is None:
        started = time.perf_counter()
        try:
            data = read_checkpoint(path)
            if len(data) != size:
                raise CheckpointError(f"{path} has {len(data)} bytes here, {size} on node 0")
        except CheckpointError as err:
            problem = f"node {runtime.node_rank} (rank {runtime.rank}): {err}"
        else:
            log.info("read %s (%.1f MB) in %.1f s, once for the %d rank(s) of node %d", path, size / 1e6,
                     time.perf_counter() - started, runtime.local_world_size, runtime.node_rank)
    problems = [p for p in all_gather_objects(problem) if p is not None]
    if problems:
        if data is not None:
            data.close()
        raise ConfigError(f"cannot resume from {path}: {problems[0].rstrip('.')}. Every node must see the run "
                          "directory (output_dir on storage that all nodes mount); use --resume none to start fresh.")
    if group is not None:
        data = data if data is not None else mmap.mmap(-1, size)
        broadcast_buffer(data, first, group)
    assert data is not None
    return data
