"""The training loop: accumulate (no_sync) → step → schedule → log (rank 0) → evaluate (all ranks) → checkpoint
(rank 0, atomic, written in the background: :mod:`distqa.checkpoint.writer`).

The job consumes one global batch per optimizer step whatever its world size: every rank runs ``accumulation``
micro-batches of ``per_rank_batch_size`` and DDP (or the sharding, :mod:`distqa.distributed.fsdp`) averages the
gradients once, on the last micro-batch. Progress is counted in optimizer steps and in examples consumed by the
whole job in the current epoch, which together with the RNG states makes a resumed run continue exactly where the
interrupted one stopped.

``distqa.train.build_trainer`` builds every object the loop uses, in order (:class:`StepPlan`,
:func:`distqa.checkpoint.resume.resume` into the model, the DDP wrap of :mod:`distqa.distributed.ddp` or the sharding,
the optimizer, scheduler and precision), and hands them to :class:`Trainer`, which only runs.

The loop knows its task only through :class:`~distqa.tasks.base.Task`: which batch columns the model reads, the
loss, and the evaluator. With an evaluator the model is scored every ``eval_every`` steps and at the end, by all
ranks together; each evaluation's metrics are logged, its state (a QA task's: its tuned thresholds) goes into the
following checkpoints as it is, and the model with the best value of the evaluator's best metric so far is kept in
``checkpoints/best.pt``. With ``early_stopping_patience`` the run ends after that many evaluations without
improvement (or a sweep's pruner's verdict), on every rank at once.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from distqa.checkpoint.format import ModelCheckpoint, Progress, TrainingCheckpoint, why_it_ends
from distqa.checkpoint.run_folder import best_checkpoint_path
from distqa.checkpoint.sharded import ShardedCheckpointWriter, checkpoint_writer
from distqa.config import Config
from distqa.distributed import fsdp
from distqa.distributed.ddp import broadcast_buffers, compile_enabled
from distqa.distributed.nccl_errors import wait_for_collectives
from distqa.distributed.precision import Precision
from distqa.distributed.rng import rng_states_to_save, seed_for_step
from distqa.distributed.runtime import (
    CollectiveTimeoutError,
    Runtime,
    barrier,
    broadcast_object,
    collective_timeouts_named,
    on_device,
)
from distqa.distributed.sampler import ResumableDistributedSampler
from distqa.distributed.stop import StopSignal, TrainingStoppedError, graceful_stop_window
from distqa.record.metrics import (
    MetricsWindow,
    RankWindow,
    StragglerWatch,
    device_name,
    peak_flops,
    progress_bar,
    summarise,
    tracked_scalars,
)
from distqa.record.tracking import RunRecord
from distqa.sweeps.pruning import TrialPruner
from distqa.tasks.base import Evaluator, Task
from distqa.training.faults import ArmedFault
from distqa.training.peer_loss import ReplicaGroup, Survivor, lost_peer, save_what_survives
from distqa.training.run_state import RunState
from distqa.training.step_plan import StepPlan, micro_batch_loss

log = logging.getLogger(__name__)


class Trainer(RunState):
    """Runs the loop over objects built by ``distqa.train``; builds none itself.

    ``model`` is the bare model (its weights are what checkpoints hold and evaluation runs); ``ddp_model`` is the
    model as training steps run it: :func:`distqa.distributed.ddp.training_module`'s (DDP, compiled), or with sharding
    the model itself (:func:`distqa.distributed.fsdp.shard_model` shards it in place).
    """

    def __init__(self, *, config: Config, runtime: Runtime, run_dir: Path, task: Task, model: nn.Module,
                 ddp_model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, precision: Precision, loader: DataLoader,
                 plan: StepPlan, evaluator: Evaluator | None, resumed: TrainingCheckpoint | None,
                 hosts: list[str] | None = None) -> None:
        if not isinstance(loader.sampler, ResumableDistributedSampler):
            raise TypeError("the loader needs a ResumableDistributedSampler for exact resumption")
        super().__init__(config=config, runtime=runtime, run_dir=run_dir, model=model, optimizer=optimizer,
                         scheduler=scheduler, precision=precision,
                         progress=resumed.progress if resumed else Progress(seeds_per_step=True),
                         task_state=resumed.task_state if resumed else None,
                         evaluation=resumed.evaluation if resumed else None)
        self.task, self.ddp_model, self.loader, self.plan, self.evaluator = task, ddp_model, loader, plan, evaluator
        self.sampler: ResumableDistributedSampler = loader.sampler
        self.hosts = hosts or [f"rank {rank}" for rank in range(runtime.world_size)]
        """Every rank's host name, to name a slow one in the log."""
        self.peak_flops = peak_flops(config.peak_tflops, runtime.device)
        self._told_no_peak = False
        self.stragglers = StragglerWatch()
        """Which window stragglers are worth a warning (the same rank for many steps, rate-limited)."""
        self.metrics = MetricsWindow(runtime.device, lambda seq_len: task.flops_per_token(model, seq_len))
        """Loss, tokens and step times since the last log line (train_step feeds it)."""
        self.first_step = self.progress.step
        self.checkpoints = checkpoint_writer(config, runtime.world_size, run_dir, runtime.device,
                                             stop_window=graceful_stop_window())
        """Rank 0's checkpoint files, written off the step; with sharded checkpoints every rank's shards too."""
        self.fault = ArmedFault.from_environment(runtime.rank, run_dir)
        self.pruner = TrialPruner(config.sweep_trial, runtime.is_main_process) if config.sweep_trial else None
        self.survivor = Survivor(self, ReplicaGroup.of(runtime, config))
        """What this rank saves after a lost peer (distqa.training.peer_loss); hsdp: with its replica's ranks."""

    # --- the loop ----------------------------------------------------------------------------
    def fit(self, record: RunRecord) -> Progress:
        """Train to the plan's last step, or until stop_at_step, early stopping or a stop signal all ranks agree on
        (:class:`~distqa.distributed.stop.TrainingStoppedError`, after a checkpoint). Collective: every rank calls
        it."""
        self._log_plan()
        if self._already_done():
            return self.progress
        stop = StopSignal(self.runtime.device, self.config.stop_check_every)
        scalars = record.writer  # rank 0's TensorBoard and tracker; None elsewhere
        # The stop signals stay handled while a survivor saves: the agent that saw the lost peer too sends SIGTERM,
        # which must not end the save half written.
        with stop.installed():
            try:
                with progress_bar(self.runtime.is_main_process and self.config.progress_bar, self.plan.total_steps,
                                  self.progress.step) as bar, self.checkpoints.finishing(), \
                        collective_timeouts_named(self.runtime, lambda: self.progress.step):
                    while self.progress.step < self.plan.total_steps:
                        if self._train_epoch(bar, scalars, stop):
                            return self.progress
                    self.finish_checkpoints()
            except (RuntimeError, CollectiveTimeoutError) as err:  # a peer gone: save what this rank holds
                if (reason := lost_peer(err)) is None or not self.runtime.is_distributed:
                    raise
                raise save_what_survives(self.survivor, err, reason) from None
        log.info("training finished at step %d", self.progress.step)
        return self.progress

    def _log_plan(self) -> None:
        log.info("training %d steps (%d per epoch): %s, precision %s, device %s", self.plan.total_steps,
                 self.plan.steps_per_epoch, self.plan.split, self.precision.name, self.runtime.device)

    def _already_done(self) -> bool:
        """A resumed run that stop_at_step or early stopping had already ended: nothing to train."""
        step, stop_at_step = self.progress.step, self.config.stop_at_step
        if not (0 < stop_at_step <= step or self._stops_early()):
            return False
        ended_by = "a sweep's pruner" if self.progress.pruned_at else "early stopping"
        log.info("already at step %d, %s: nothing to do", step, f"where {ended_by} ended the run"
                 if self._stops_early() else f"past stop_at_step={stop_at_step}")
        return True

    def _train_epoch(self, bar: tqdm, scalars: RunRecord | None, stop: StopSignal) -> bool:
        """The steps left in the current epoch, from the position the progress holds (a resumed run's included).
        True when the run ends in it (stop_at_step, early stopping), its checkpoints complete."""
        micro_batches, steps_left = self._enter_epoch()
        for _ in range(steps_left):
            self._take_step(micro_batches, bar)
            if self._after_step(bar, scalars, stop):
                return True
        return False

    def _enter_epoch(self) -> tuple[Iterator[dict[str, torch.Tensor]], int]:
        """The loader's micro-batches from the progress's position (in the next epoch when this one is done), and the
        steps left in their epoch."""
        progress = self.progress
        # The sampler counts the whole global batches left: a run resumed with another batch may stand between two.
        if self.sampler.steps_left(progress.samples_in_epoch) == 0:
            # Here, not after the epoch's last step: a run that ends there keeps the position its last
            # checkpoint holds (summary.json and the checkpoint agree).
            progress.epoch += 1
            progress.samples_in_epoch = 0
        self.sampler.set_epoch(progress.epoch)
        self.sampler.resume_at(progress.samples_in_epoch)
        steps_left = min(self.sampler.steps_left(progress.samples_in_epoch), self.plan.total_steps - progress.step)
        return iter(self.loader), steps_left

    def _take_step(self, micro_batches: Iterator[dict[str, torch.Tensor]], bar: tqdm) -> None:
        """One optimizer step, counted in the progress, the metrics window and the bar."""
        progress, started = self.progress, time.perf_counter()
        if progress.seeds_per_step:  # resumable without any rank's RNG state (a run begun before goes on its streams)
            seed_for_step(self.config.seed, progress.step + 1, self.runtime.rank)
        loss, grad_norm = self.train_step(micro_batches)
        if progress.step == self.first_step and compile_enabled(self.config, self.runtime.device):
            log.info("torch.compile: the first step took %.1f s, compilation included (once per process; "
                     "the first log window's throughput includes it)", time.perf_counter() - started)
        progress.step += 1
        progress.samples_in_epoch += self.config.global_batch_size
        self.survivor.step_done()
        self.fault.at(progress.step)  # INJECT_FAULT's kill or hang, to test a resume (distqa.training.faults)
        self.metrics.add(loss, grad_norm)
        bar.update(1)

    def _after_step(self, bar: tqdm, scalars: RunRecord | None, stop: StopSignal) -> bool:
        """What follows a step, in order: its log line, the evaluation and checkpoints that are due, then a stop
        signal (raises TrainingStoppedError), stop_at_step or early stopping (True: the run ends here)."""
        config, step, last = self.config, self.progress.step, self.progress.step == self.plan.total_steps
        if step % config.log_every == 0 or last:
            self._log_metrics(self.metrics.flush(), bar, scalars)
        best = self._evaluate_if_due(last, scalars)
        early = not last and self._stops_early()
        stopping = step == config.stop_at_step or early
        saved = last or stopping or _due(config.checkpoint_every, step)
        if saved or best:
            self.save_checkpoint(step=saved, best=best)
        if not last and (received := stop.agreed(step)):
            path = self.checkpoints.step_path(step) if saved else self.save_checkpoint()
            self._log_partial_window(bar, scalars)
            self.finish_checkpoints()
            raise TrainingStoppedError(signal.Signals(received).name, step, path)
        if stopping:
            self._log_partial_window(bar, scalars)
            log.info("%s", why_it_ends(self.progress, early, self.config.early_stopping_min_delta))
            self.finish_checkpoints()
        return stopping

    def _evaluate_if_due(self, last: bool, scalars: RunRecord | None) -> bool:
        """Evaluate (all ranks) every eval_every steps and at the last; True when best.pt is to be saved."""
        if self.evaluator is None or not (last or _due(self.config.eval_every, self.progress.step)):
            return False
        with self.metrics.paused():  # samples/s and ms/step measure training alone
            return self.evaluate(scalars)

    def train_step(self, micro_batches: Iterator[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``accumulation`` micro-batches; returns (this rank's share of the mean loss over
        the global batch, grad norm): the ranks' values average to the global batch's mean loss."""
        loss_sum = torch.zeros((), device=self.runtime.device)
        self.metrics.start_step()
        for micro_step in range(self.plan.accumulation):
            batch = on_device(next(micro_batches), self.runtime.device)
            self.metrics.count_batch(batch, self.plan.real_rows[micro_step] if self.plan.real_rows else None)
            # Gradients are all-reduced only on the last micro-batch; before it they accumulate locally.
            syncing = micro_step == self.plan.accumulation - 1
            skip_sync = fsdp.gradient_sync_skipped(self.ddp_model) if self.runtime.is_distributed and not syncing \
                else contextlib.nullcontext()
            with skip_sync:
                with self.autocast():
                    output = self.ddp_model(**{name: batch[name] for name in self.task.input_names})
                    # The mean over the real rows, weighed by their part of the global batch (step_plan).
                    loss = micro_batch_loss(self.task.loss, output, batch, self.plan, micro_step,
                                            self.config.per_rank_batch_size)
                if syncing:  # what comes next waits for the other ranks: the rank's own work ends here
                    self.metrics.local_work_done()
                self.precision.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        self.precision.scaler.unscale_(self.optimizer)
        grad_norm = fsdp.local_norm(torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.config.max_grad_norm or float("inf")))
        if self.config.save_on_peer_loss:  # NCCL: no update from gradients that a lost peer left partial
            wait_for_collectives(self.runtime, self.config.dist_timeout_s, self.progress.step)
        self.survivor.update_begins()  # until step_done, no complete step to save (distqa.training.peer_loss)
        self.precision.scaler.step(self.optimizer)
        self.precision.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm

    # --- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, step: bool = True, best: bool = False) -> Path:
        """Collective with ``step`` (sharded checkpoints: the shards; a run begun before ``seeds_per_step``: the random
        states, :func:`~distqa.distributed.rng.rng_states_to_save`): rank 0 hands the step checkpoint,
        and with ``best`` best.pt, to its writer, which copies this step's state to host memory and writes
        the files in the background (distqa.checkpoint.writer). Returns the step checkpoint's path."""
        rng_states = rng_states_to_save(self.progress.seeds_per_step, self.runtime.world_size) if step else []
        path, main = self.checkpoints.step_path(self.progress.step), self.runtime.is_main_process
        shards = step and isinstance(self.checkpoints, ShardedCheckpointWriter)  # each rank writes its own shards
        # Collective when the model is sharded: rank 0 gets whole tensors, in the layout a DDP run saves.
        model_state = fsdp.full_model_state(self.model, main) if best or not shards else {}
        optimizer_state = fsdp.full_optimizer_state(self.model, self.optimizer, main) if step and not shards else {}
        rest = None  # with shards: rank 0's part of the step checkpoint, all but the weights and optimizer state
        if main:
            files: dict[Path, ModelCheckpoint] = {}
            if step:
                files[path] = self.training_checkpoint(model_state, optimizer_state, rng_states)
            if best:
                files[best_checkpoint_path(self.run_dir)] = self.model_checkpoint(model_state)
            rest = files.pop(path) if shards else None
            if files:
                self.checkpoints.submit(files)
        if shards:  # collective: every rank's shards, and rank 0's rest beside them
            self.checkpoints.submit_sharded(self.progress.step, self.model, self.optimizer, rest)  # type: ignore[attr-defined]
        return path

    def finish_checkpoints(self) -> None:
        """Collective, before the loop ends or stops: rank 0 waits until its files are complete and durable
        (raising a write's error), and the others wait for rank 0: on a stop, the first worker to exit has the
        agents end the rest (distqa.launch.agent), which must not catch rank 0 mid-write."""
        self.checkpoints.wait()  # a file writer has nothing in flight on the other ranks
        barrier()

    # --- evaluation --------------------------------------------------------------------------
    def evaluate(self, scalars: RunRecord | None = None) -> bool:
        """Score the validation data on all ranks; rank 0 logs it. True when the model is the best so far
        (best.pt is to be saved)."""
        assert self.evaluator is not None
        started = time.perf_counter()
        if self.task.sync_buffers:  # every rank evaluates rank 0's model, the one the checkpoints hold
            broadcast_buffers(self.model, self.runtime)
        with fsdp.gathered_for_evaluation(self.model):  # a sharded model: whole, so forwards need no peers
            evaluation = self.evaluator.evaluate(self.model, self.precision)
        metrics, step, progress = evaluation.metrics, self.progress.step, self.progress
        best = self.evaluator.best_metric
        if best.name not in metrics:
            raise KeyError(f"the evaluator of task {self.task.name!r} names {best.name!r} as its best metric "
                           f"but returned only {sorted(metrics)}")
        value = float(metrics[best.name])
        previous = progress.best_value if progress.best_metric == best.name else None
        improved = best.improves(value, previous)
        # Rank 0 counts for early stopping and every rank takes its count: all stop at the same step.
        without_improvement = broadcast_object(0 if best.improves(value, previous, self.config.early_stopping_min_delta)
                                               else progress.evaluations_without_improvement + 1)
        # Every rank: rank 0 asked the sweep's pruner and broadcast its answer.
        pruned = self.pruner is not None and self.pruner.prunes(step, value, best) and step < self.plan.total_steps
        # Past the collectives: a peer lost in one leaves the state of the evaluation before whole
        # (distqa.training.peer_loss).
        progress.evaluations_without_improvement = without_improvement
        if improved:
            progress.best_metric, progress.best_mode, progress.best_value = best.name, best.mode, value
        if pruned:
            progress.pruned_at = step
        self.task_state, self.evaluation = evaluation.state, {"step": step, **metrics}
        if self.runtime.is_main_process:
            log.info("eval at step %d: %s, %.1f s%s", step, evaluation.describe(), time.perf_counter() - started,
                     " (best so far)" if improved else "")
            if scalars is not None:
                for name, metric in metrics.items():
                    scalars.add_scalar(f"eval/{name}", metric, step)
                scalars.flush()
        return improved

    # --- helpers -----------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """A training forward's autocast; none for a sharded model, whose policy casts the gathered weights."""
        return contextlib.nullcontext() if fsdp.is_sharded(self.ddp_model) else self.precision.autocast()

    def _stops_early(self) -> bool:  # early stopping's patience is spent, or a sweep's pruner stopped the trial
        return 0 < self.config.early_stopping_patience <= self.progress.evaluations_without_improvement \
            or self.progress.pruned_at > 0

    def _log_partial_window(self, bar: tqdm, scalars: RunRecord | None) -> None:
        """Collective, where the run stops before its next log line (a graceful stop, stop_at_step, early
        stopping): the steps since the last line are logged now, not lost."""
        if self.metrics.steps > 0:
            self._log_metrics(self.metrics.flush(), bar, scalars)

    def _log_metrics(self, ranks: list[RankWindow], bar: tqdm, scalars: RunRecord | None) -> None:
        """Rank 0: one line with the job's loss and throughput, one with every rank's step times."""
        if not self.runtime.is_main_process:
            return
        step, lr = self.progress.step, self.scheduler.get_last_lr()[0]
        window = summarise(ranks, self.config.global_batch_size, self.peak_flops)
        step_time = window.seconds / window.steps
        bar.set_postfix(loss=f"{window.loss:.4f}", lr=f"{lr:.2e}", refresh=False)
        counts_tokens = window.padded_tokens_per_s > 0  # a task whose batches have no attention_mask counts none
        tokens = f" | {window.tokens_per_s:.0f} tokens/s ({window.padded_tokens_per_s:.0f} padded)" \
            if counts_tokens else ""
        mfu = f" | MFU {100 * window.mfu:.1f} %" if window.mfu is not None else ""
        log.info("step %d/%d | epoch %d | loss %.4f | lr %.3e | grad norm %.3f | %.1f samples/s%s%s | %.0f ms/step",
                 step, self.plan.total_steps, self.progress.epoch, window.loss, lr, window.grad_norm,
                 window.samples_per_s, tokens, mfu, 1000 * step_time)
        if window.counts_flops and self.peak_flops is None and not self._told_no_peak:
            self._told_no_peak = True  # said once, where the task counts FLOPs (no MFU is possible otherwise)
            log.info("no MFU in the logs: the bf16 peak of %s is not in distqa.record.throughput's table; "
                     "set --peak-tflops", device_name(self.runtime.device))
        shown = range(len(ranks)) if len(ranks) <= 8 else sorted({0, *window.extremes})  # one line, even at 64
        per_rank = ", ".join(f"{r}: {1000 * ranks[r].step_p50:.0f}/{1000 * ranks[r].step_p95:.0f} local "
                             f"{1000 * ranks[r].local_p50:.0f}/{1000 * ranks[r].local_p95:.0f}" for r in shown)
        log.info("step time by rank%s, p50/p95 ms over %d steps (local = data + forward, before the gradient "
                 "all-reduce): %s", "" if len(ranks) <= 8 else " (0, fastest, slowest)", window.steps, per_rank)
        named = self.stragglers.observe(window, step) if step - window.steps > self.first_step else None  # not warm-up
        if named is not None:
            log.warning("straggler: rank %d (%s) takes %.0f ms of local work per step (p50), the median rank "
                        "%.0f ms, for the last %d steps; the others wait for it in every all-reduce", named,
                        self.hosts[named], 1000 * ranks[named].local_p50, 1000 * window.local_p50_median,
                        self.stragglers.streak_steps)
        if scalars is not None:
            for name, value in tracked_scalars(window, ranks, lr).items():
                scalars.add_scalar(name, value, step)
            scalars.flush()


def _due(every: int, step: int) -> bool:
    """Whether a task scheduled every ``every`` steps (0 = never) runs after ``step``."""
    return every > 0 and step % every == 0
