"""What a training log line reports: loss, throughput, model-FLOPs utilisation, and every rank's step times. Each
figure, the straggler rule and the TensorBoard names: docs/PERFORMANCE.md, "Throughput, MFU and slow ranks in the
logs" (the rule's thresholds are :data:`STRAGGLER_RATIO`, :data:`STRAGGLER_MIN_EXCESS_S`,
:data:`STRAGGLER_MIN_STEPS` and :data:`STRAGGLER_REPEAT_STEPS`).

:class:`MetricsWindow` collects the steps since the last log line on each rank, on the device where it can (no host
sync per step: on GPUs the times are CUDA events on the compute stream, read at flush, which waits for them anyway;
on CPUs the host clock), and :meth:`MetricsWindow.flush` gathers every rank's figures in one collective per log
line, never per step. :func:`summarise` turns them into job-wide numbers and marks the window's slowest rank, which
:class:`StragglerWatch` names only when it stays the slowest. Only a micro-batch's real examples count tokens and
FLOPs: the copies that pad a rank's uneven share of the global batch to whole micro-batches
(:meth:`MetricsWindow.count_batch`) do not.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from distqa.distributed.runtime import all_gather_tensor
from distqa.record.throughput import peak_bf16_flops

STRAGGLER_RATIO = 1.2
"""A rank whose local-time p50 is this many times the median rank's is marked as the window's straggler."""
STRAGGLER_MIN_EXCESS_S = 0.002
"""... and exceeds it by this many seconds at least: a rank 20 % slower on a step of 100 µs costs nothing."""
STRAGGLER_MIN_STEPS = 20
"""A straggler is named in the log once the same rank was marked in every window for this many steps in a row."""
STRAGGLER_REPEAT_STEPS = 1000
"""... and named again, while it stays one, at most once in this many steps."""


@dataclass(frozen=True)
class RankWindow:
    """One rank's figures over one log window (times in seconds)."""

    loss: float
    grad_norm: float
    steps: float
    step_p50: float
    step_p95: float
    local_p50: float
    local_p95: float
    tokens: float
    padded_tokens: float
    flops: float
    seconds: float


class _Clock:
    """Time stamps on the host, or CUDA events on the device's current stream (no host sync)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def now(self) -> float | torch.cuda.Event:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: float | torch.cuda.Event, end: float | torch.cuda.Event) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000
        return end - start


class MetricsWindow:
    """Loss, grad norm, token counts and step times since the last log line, on one rank.

    The trainer calls :meth:`start_step`, :meth:`count_batch` per micro-batch, :meth:`local_work_done`
    before the backward that all-reduces, then :meth:`add`; every rank calls :meth:`flush` at log time.
    """

    def __init__(self, device: torch.device,
                 flops_per_token: Callable[[int], float | None] | None = None) -> None:
        """``flops_per_token``: training FLOPs per token at a sequence length, None where not counted."""
        self.device, self.flops_per_token = device, flops_per_token
        self.clock = _Clock(device)
        self._flops_by_seq_len: dict[int, float] = {}
        self._reset()

    def _reset(self) -> None:
        self.sums = torch.zeros(3, device=self.device)  # loss, grad norm, non-padding tokens
        self.steps = 0
        self.padded_tokens = 0
        self.flops = 0.0
        self.marks: list[tuple[object, object, object]] = []
        self._step_marks: list[object] = []
        self.started = time.perf_counter()

    def start_step(self) -> None:
        self._step_marks = [self.clock.now()]

    def count_batch(self, batch: Mapping[str, torch.Tensor], rows: int | None = None) -> None:
        """Count the tokens (and their model FLOPs) of one micro-batch's first ``rows`` rows, its real examples (None:
        all): the copies that pad a rank's share to whole micro-batches train nothing, so they count for nothing."""
        mask = batch.get("attention_mask")
        if mask is None or mask.ndim != 2:
            return
        if rows is not None:
            mask = mask[:rows]
        self.sums[2] += mask.sum()
        batch_size, seq_len = mask.shape
        self.padded_tokens += batch_size * seq_len
        self.flops += batch_size * seq_len * self._flops_per_token(seq_len)

    def local_work_done(self) -> None:
        """Mark the end of this rank's own work in the step: the backward that waits for the others starts."""
        self._step_marks.append(self.clock.now())

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.sums[:2] += torch.stack([loss.float(), grad_norm.float()])
        self.steps += 1
        if len(self._step_marks) == 2:
            self.marks.append((*self._step_marks, self.clock.now()))
        self._step_marks = []

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave the time spent in the block out of the window."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.started += time.perf_counter() - started

    def flush(self) -> list[RankWindow]:
        """Every rank's window, in rank order (a collective: every rank must call it): an all-gather, though only rank
        0 logs, so that every rank meets a lost peer in the same collective (docs/SCALING.md, "The log window")."""
        steps = [self.clock.seconds(start, end) for start, _, end in self.marks]
        local = [self.clock.seconds(start, done) for start, done, _ in self.marks]
        count = max(self.steps, 1)
        loss, grad_norm, tokens = self.sums.double().tolist()
        mine = [loss / count, grad_norm / count, count, *_p50_p95(steps), *_p50_p95(local), tokens,
                self.padded_tokens, self.flops, max(time.perf_counter() - self.started, 1e-9)]
        gathered = all_gather_tensor(torch.tensor(mine, dtype=torch.float64, device=self.device))
        self._reset()
        return [RankWindow(*row) for row in gathered.tolist()]

    def _flops_per_token(self, seq_len: int) -> float:
        if seq_len not in self._flops_by_seq_len:
            counted = self.flops_per_token(seq_len) if self.flops_per_token is not None else None
            self._flops_by_seq_len[seq_len] = counted or 0.0
        return self._flops_by_seq_len[seq_len]


def _p50_p95(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    if len(values) == 1:
        return values[0], values[0]
    cuts = statistics.quantiles(values, n=20, method="inclusive")  # 5 %, 10 %, …, 95 %
    return statistics.median(values), cuts[-1]


@dataclass(frozen=True)
class Summary:
    """Job-wide figures of one log window (rank 0's clock)."""

    loss: float
    grad_norm: float
    steps: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float
    """Non-padding tokens of every rank per second."""
    padded_tokens_per_s: float
    mfu: float | None
    """Model-FLOPs utilisation (0..1), None without a peak for the device."""
    counts_flops: bool
    """Whether the task counted model FLOPs in the window (``Task.flops_per_token``): an MFU is possible."""
    extremes: tuple[int, int]
    """The ranks with the shortest and the longest local-time p50."""
    local_p50_median: float
    """The median over ranks of their local-time p50 (seconds)."""
    straggler: int | None
    """The rank whose local time exceeds the median rank's by STRAGGLER_RATIO (and STRAGGLER_MIN_EXCESS_S), if one
    does in this window (:class:`StragglerWatch` decides whether that is worth a warning)."""


def summarise(ranks: list[RankWindow], global_batch_size: int, peak_flops_per_rank: float | None) -> Summary:
    """Job-wide loss (mean over ranks), throughput and MFU, and the straggler, from every rank's window."""
    main = ranks[0]
    seconds = main.seconds
    flops = sum(r.flops for r in ranks)
    mfu = flops / seconds / (peak_flops_per_rank * len(ranks)) if peak_flops_per_rank and flops else None
    local = [r.local_p50 for r in ranks]
    slowest = max(range(len(ranks)), key=local.__getitem__)
    fastest = min(range(len(ranks)), key=local.__getitem__)
    median = statistics.median(local)
    straggler = slowest if len(ranks) > 1 and median > 0 and local[slowest] > STRAGGLER_RATIO * median \
        and local[slowest] - median >= STRAGGLER_MIN_EXCESS_S else None
    return Summary(loss=statistics.fmean(r.loss for r in ranks), grad_norm=main.grad_norm, steps=int(main.steps),
                   seconds=seconds, samples_per_s=main.steps * global_batch_size / seconds,
                   tokens_per_s=sum(r.tokens for r in ranks) / seconds,
                   padded_tokens_per_s=sum(r.padded_tokens for r in ranks) / seconds, mfu=mfu, counts_flops=flops > 0,
                   extremes=(fastest, slowest), local_p50_median=median, straggler=straggler)


def tracked_scalars(window: Summary, ranks: list[RankWindow], lr: float) -> dict[str, float]:
    """A log window as TensorBoard and tracker scalars: ``train/<name>`` for the job, then
    ``ranks/<time>_ms/rank_<R>`` for every rank's step and local times."""
    values = {"loss": window.loss, "lr": lr, "grad_norm": window.grad_norm, "samples_per_s": window.samples_per_s,
              "step_time_s": window.seconds / window.steps}
    if window.padded_tokens_per_s > 0:  # a task whose batches have no attention_mask counts none
        values |= {"tokens_per_s": window.tokens_per_s, "padded_tokens_per_s": window.padded_tokens_per_s}
    if window.mfu is not None:
        values["mfu"] = window.mfu
    scalars = {f"train/{name}": value for name, value in values.items()}
    for rank, times in enumerate(ranks):
        for name in ("step_p50", "step_p95", "local_p50", "local_p95"):
            scalars[f"ranks/{name}_ms/rank_{rank}"] = 1000 * getattr(times, name)
    return scalars


class StragglerWatch:
    """Rank 0's memory of the windows' stragglers: :meth:`observe` returns the rank to name in the log, when the same
    rank has been each window's straggler for :data:`STRAGGLER_MIN_STEPS` steps in a row and was not named in the last
    :data:`STRAGGLER_REPEAT_STEPS` steps; None otherwise."""

    def __init__(self) -> None:
        self.rank: int | None = None
        """The rank that was the straggler of every window of the current streak."""
        self.streak_steps = 0
        """The steps of those windows."""
        self._named_at: dict[int, int] = {}  # rank -> the step of its latest warning

    def observe(self, window: Summary, step: int) -> int | None:
        """Take the window that ends at ``step``; the straggler to name now, if any."""
        if window.straggler is None or window.straggler != self.rank:
            self.rank, self.streak_steps = window.straggler, 0
        if self.rank is None:
            return None
        self.streak_steps += window.steps
        named = self._named_at.get(self.rank)
        if self.streak_steps >= STRAGGLER_MIN_STEPS and (named is None or step - named >= STRAGGLER_REPEAT_STEPS):
            self._named_at[self.rank] = step
            return self.rank
        return None


def count_with_unit(count: int) -> str:
    """A count as a log line shows it: 577, 1.2K, 3.4M, 1.1B (one decimal from a thousand on)."""
    if count < 1000:
        return str(count)
    for unit, scale in (("B", 1e9), ("M", 1e6)):
        if count >= 0.99995 * scale:  # 999,960 is 1.0M, not 1000.0K
            return f"{count / scale:.1f}{unit}"
    return f"{count / 1e3:.1f}K"


@contextlib.contextmanager
def progress_bar(show: bool, total_steps: int, step: int) -> Iterator[tqdm]:
    """The training's bar from ``step`` to ``total_steps``, where ``show`` (rank 0 with the ``progress_bar``
    setting) and on a terminal only (piped output gets the log lines instead); log lines go through tqdm.write
    meanwhile so they never land in the middle of the bar."""
    bar = tqdm(total=total_steps, initial=step, desc="train", unit="step", disable=None if show else True,
               mininterval=1.0)
    try:
        with logging_redirect_tqdm():
            yield bar
    finally:
        bar.close()


def peak_flops(peak_tflops: float | None, device: torch.device) -> float | None:
    """Dense bf16 peak FLOP/s of one rank's device (the setting ``peak_tflops``, else by GPU name); None: no MFU."""
    if peak_tflops:
        return peak_tflops * 1e12
    return peak_bf16_flops(device_name(device))


def device_name(device: torch.device) -> str:
    """The GPU's name as CUDA gives it, or "a CPU"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "a CPU"
