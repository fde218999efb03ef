"""Train a task's model with DistributedDataParallel or sharded (FSDP2), on one process or many nodes: the task
(``--task``) brings the data, the model, the loss and the evaluation; this run brings the rest (distribution, the
same global batch on any world size, checkpoints and exact resume, graceful stops, logging).

One process (CPU, or one GPU)::

    python -m distqa.train

One node, all of its GPUs::

    torchrun --standalone --nproc-per-node gpu -m distqa.train --preset bert-base

Two nodes (run on each; the node whose address is the endpoint hosts the rendezvous)::

    torchrun --nnodes 2 --nproc-per-node gpu --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29400 \\
        --rdzv-id my-run -m distqa.train --preset bert-base --run-name my-run

Two emulated nodes on this machine, through the same c10d rendezvous::

    scripts/run_distributed_locally.sh

What the run trains is its task (``--task``: a registered name, ``dummy`` by default, or a fork's
``package.module:ClassName``, docs/FORKING.md). A task with an evaluator is scored every ``--eval-every`` steps
and at the end, on all ranks, and its best model kept in ``checkpoints/best.pt``; then its own commands answer a
file and score the answers (the QA tasks': docs/EVALUATION.md)::

    python -m distqa.predict --checkpoint results/local/checkpoints/best.pt --input FILE --output ANSWERS

Every setting (``python -m distqa.train --help``) can come from a preset, ``.env``/``DISTQA_*``
variables or flags; see ``distqa.config.sources``. A restart with the same ``--run-name`` resumes from its
newest checkpoint.

:func:`train` is the story of a run: the checks every rank passes, then :func:`build_trainer` (data, model, resume,
the DDP wrap or the sharding (``--data-parallel``), optimizer and schedule), the loop.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from dotenv import load_dotenv
from torch import nn
from torch.utils.data import DataLoader, Dataset

from distqa.checkpoint.format import Progress
from distqa.checkpoint.resume import restore_training_state, resume
from distqa.config import Config, ConfigError
from distqa.config.errors import SKIP_ADVICE, BadRecordError, DataError, DiskFullError, print_error, report_failure
from distqa.config.sources import dotenv_file, load_config
from distqa.distributed.elastic import ROUND_VARIABLE, NodeRange, check_node_range, membership_line
from distqa.distributed.fsdp import data_parallel_model
from distqa.distributed.nccl_errors import survive_nccl_errors
from distqa.distributed.precision import Precision
from distqa.distributed.rng import seed_everything
from distqa.distributed.runtime import (
    CollectiveTimeoutError,
    Runtime,
    distributed_runtime,
    read_torchrun_env,
    setup_logging,
)
from distqa.distributed.sampler import ResumableDistributedSampler
from distqa.distributed.stop import STOPPED_EXIT_CODE, TrainingStoppedError
from distqa.record.metrics import count_with_unit
from distqa.record.rundir import prepare_run_dir
from distqa.record.tracking import run_record
from distqa.tasks import make_task
from distqa.tasks.base import Task
from distqa.training.optim import build_optimizer, build_scheduler
from distqa.training.peer_loss import PeerLostError
from distqa.training.preflight import check_at_training_start
from distqa.training.step_plan import StepPlan
from distqa.training.trainer import Trainer

log = logging.getLogger("distqa.train")


def main(argv: Sequence[str] | None = None) -> int:
    # .env may also carry settings for libraries (NCCL_*, HF_HOME, …), so it goes into the environment.
    load_dotenv(dotenv_file(), override=False)
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere+ GPUs; no effect on CPU
    try:
        given = load_config(argv)
        ranks = read_torchrun_env()
        setup_logging(ranks["RANK"])
        node_range = NodeRange.from_environment()
        check_node_range(given, node_range)  # worker.sh --min-nodes: every world size has an example for each rank
        # grow_global_batch, except over an elastic range, where the batch would change with the membership.
        config = given if node_range is not None and node_range.elastic else given.for_world_size(ranks["WORLD_SIZE"])
        task = make_task(config)
        # Before any process group, so that no rank waits in a collective meanwhile: a model that cannot load
        # fails here, and a single process builds a missing feature cache itself.
        task.check_inputs(may_build=ranks["WORLD_SIZE"] == 1)
        if config.save_on_peer_loss:  # NCCL's watchdog then aborts a lost peer's collective, not the process
            survive_nccl_errors()
        with distributed_runtime(config.device, config.dist_timeout_s) as runtime:
            run_dir = prepare_run_dir(config, runtime)
            if config != given:
                log.info("grow_global_batch: %d ranks × %d per rank: global batch %d -> %d, lr %.3g -> %.3g, "
                         "warm-up %d -> %d steps", runtime.world_size, config.per_rank_batch_size,
                         given.global_batch_size, config.global_batch_size, given.lr, config.lr,
                         given.warmup_steps, config.warmup_steps)
            try:
                train(config, runtime, run_dir, task)
            except TrainingStoppedError as stopped:  # every rank agreed; rank 0 wrote the checkpoint
                log.warning("%s", stopped.report(runtime.rank))
                stopped.write_report(runtime.rank)
                return STOPPED_EXIT_CODE
    except ConfigError as err:
        return report_failure(f"distqa.train: configuration error: {err}", 2)
    except DataError as err:
        advice = f" {SKIP_ADVICE}" if isinstance(err, BadRecordError) else ""
        return report_failure(f"distqa.train: data error: {err}{advice}", 2)
    except PeerLostError as err:  # a peer gone or stalled: this rank saved what it held, and leaves (peer_loss)
        print_error(f"distqa.train: {err}")
        return err.exit_code(int(os.environ.get("RANK", "0")))
    except CollectiveTimeoutError as err:  # a peer stalled outside the training loop; this rank leaves
        print_error(f"distqa.train: collective timeout: {err}")
        return 1
    except DiskFullError as err:  # rank 0, writing a checkpoint; the newest complete one is intact
        print_error(f"distqa.train: disk full: {err.strerror}. Resume later with --resume auto.")
        return 1
    return 0


def train(config: Config, runtime: Runtime, run_dir: Path, task: Task) -> Progress:
    log.info("rank %d of %d (node %d, local rank %d) on %s with %s, data parallel %s; task %s; run directory %s",
             runtime.rank, runtime.world_size, runtime.node_rank, runtime.local_rank, runtime.device, runtime.backend,
             config.data_parallel, task.name or config.task, run_dir)
    # Ranks with other code, config or library versions stop here, all with the same message (no RNG drawn).
    places = check_at_training_start(config, runtime, task)  # every rank's place, on rank 0
    hosts = [place.host for place in places]
    node_range = NodeRange.from_environment()
    if runtime.is_main_process and node_range is not None and node_range.elastic:
        nodes = sorted({place.launcher_node or f"{place.host} (group rank {place.node_rank})" for place in places})
        log.info("%s", membership_line(os.environ.get(ROUND_VARIABLE, "?"), nodes, config, runtime.world_size))
    task.setup(runtime)  # e.g. hub weights: rank 0 downloads, the others wait, then all read the cache
    trainer = build_trainer(config, runtime, run_dir, task, hosts=hosts)
    # The record: TensorBoard and the tracker on rank 0, closed with how the run ended.
    with run_record(config, runtime, run_dir, trainer.progress) as record:
        return trainer.fit(record)


def build_trainer(config: Config, runtime: Runtime, run_dir: Path, task: Task, *, dataset: Dataset | None = None,
                  evaluation: bool = True, hosts: list[str] | None = None, pin_memory: bool | None = None,
                  wrap: Callable[[nn.Module, Precision], nn.Module] | None = None) -> Trainer:
    """Collective. The :class:`~distqa.training.trainer.Trainer` of a run, assembled in the order that makes it exact:
    data, model, resume, the DDP wrap or the sharding, optimizer and schedule (the resumed state restored into them),
    evaluation. The benchmarks build theirs here too (``bench/our_trainer.py``): ``dataset`` replaces the task's
    training split, ``evaluation=False`` leaves the task's evaluator out, ``pin_memory`` goes to
    :func:`build_loader`, and ``wrap`` replaces :func:`~distqa.distributed.fsdp.data_parallel_model` (the model as
    training steps run it, from the bare model and the precision)."""
    # Data: every rank reads a disjoint share of each epoch's permutation.
    loader = build_loader(config, runtime, task.train_dataset() if dataset is None else dataset, task.collate,
                          pin_memory)
    plan = StepPlan.of(config, loader.sampler, runtime.world_size)

    # Model: identical initial weights on every rank; then each rank draws its own dropout masks.
    seed_everything(config.seed)
    model = task.build_model().to(runtime.device)
    seed_everything(config.seed + runtime.rank)
    parameters = sum(p.numel() for p in model.parameters())
    log.info("model %s: %s parameters", type(model).__name__, count_with_unit(parameters))

    # Resume: the newest checkpoint of this run (or --resume PATH); its weights go into the bare model now.
    resumed = resume(config, runtime, run_dir, model)
    precision = Precision.choose(config.precision, runtime.device)

    # Data parallelism (data_parallel): DDP keeps one replica per rank, averages the gradients over the ranks in
    # backward and broadcasts rank 0's buffers before each forward unless the task's are constants; fsdp/hsdp
    # shard the weights, gradients and optimizer state over the ranks (the task's sharding units, then the root),
    # computing in the precision's dtype. Compiled on GPUs. One process has nothing to share: it runs the model.
    if wrap is None:
        training_model = data_parallel_model(model, runtime, config, precision, sync_buffers=task.sync_buffers,
                                             sharding_units=task.sharding_units)
    else:
        training_model = wrap(model, precision)

    # Optimisation: AdamW over the parameters as training holds them (sharded or not), warm-up then the
    # lr_schedule over the whole run; a resumed run's state restored into them, and the RNGs.
    optimizer = build_optimizer(model, config, runtime.device)
    scheduler = build_scheduler(optimizer, config, plan.total_steps)
    if resumed:
        restore_training_state(resumed, config, runtime, model, optimizer, scheduler, precision)

    # Evaluation: the task's own, on all ranks; it picks best.pt and, with a patience, when to stop early.
    evaluator = task.evaluator(runtime) if evaluation else None
    if evaluation and evaluator is None and config.early_stopping_patience:
        log.warning("early_stopping_patience %d is ignored: task %r has no evaluation", config.early_stopping_patience,
                    task.name)

    return Trainer(config=config, runtime=runtime, run_dir=run_dir, task=task, model=model,
                   ddp_model=training_model, optimizer=optimizer, scheduler=scheduler, precision=precision,
                   loader=loader, plan=plan, evaluator=evaluator, resumed=resumed, hosts=hosts)


def build_loader(config: Config, runtime: Runtime, dataset: Dataset, collate: Callable[..., Any],
                 pin_memory: bool | None = None) -> DataLoader:
    """This rank's training loader: its share of each step's global batch (disjoint from the other ranks', resumable
    mid-epoch at any world size), in ``accumulation`` micro-batches of ``per_rank_batch_size`` put together by the
    task's ``collate`` (a short share padded with copies that the trainer weighs 0: every micro-batch has one shape),
    in pinned host memory on GPUs unless ``pin_memory`` says otherwise. The benchmarks in ``bench/`` time this same
    loader."""
    rows_per_step = config.accumulation_steps(runtime.world_size) * config.per_rank_batch_size
    sampler = ResumableDistributedSampler(dataset, num_replicas=runtime.world_size, rank=runtime.rank,
                                          shuffle=True, seed=config.seed, global_batch_size=config.global_batch_size,
                                          rows_per_step=rows_per_step)
    return DataLoader(dataset, batch_size=config.per_rank_batch_size, sampler=sampler, drop_last=True,
                      collate_fn=collate, num_workers=config.num_workers, persistent_workers=config.num_workers > 0,
                      pin_memory=runtime.device.type == "cuda" if pin_memory is None else pin_memory,
                      # Each new iterator draws a worker seed; from its own generator, that draw leaves
                      # the global RNG (dropout, checkpointed for exact resumption) untouched.
                      generator=torch.Generator().manual_seed(config.seed))


if __name__ == "__main__":
    sys.exit(main())
