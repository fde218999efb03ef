"""``--lr-schedule linear|cosine|constant``: each, after the warm-up, is transformers' schedule of that name at every
step (and the closed form written here, so a schedule wired to the wrong function fails too), the warm-up is cut to
a run shorter than it, and the schedule defines the run: a resume with another one is refused. Also what early
stopping counts as an improvement (`--early-stopping-min-delta`) and its need of evaluations."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from distqa.config import Config, ConfigError
from distqa.tasks.base import BestMetric
from distqa.training.optim import build_scheduler

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT

TOTAL, WARMUP = 40, 6


def closed_form(schedule: str, step: int, warmup: int = WARMUP, total: int = TOTAL) -> float:
    """The multiplier of lr at ``step``: linear warm-up from 0, then the schedule's decay over the rest."""
    if step < warmup:
        return step / warmup
    decay_steps = max(1, total - warmup)
    done = (step - warmup) / decay_steps
    return {"linear": max(0.0, (total - step) / decay_steps), "cosine": max(0.0, 0.5 * (1 + math.cos(math.pi * done))),
            "constant": 1.0}[schedule]


def learning_rates(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


@pytest.mark.parametrize(("schedule", "reference"), [
    ("linear", lambda opt: get_linear_schedule_with_warmup(opt, WARMUP, TOTAL)),
    ("cosine", lambda opt: get_cosine_schedule_with_warmup(opt, WARMUP, TOTAL)),
    ("constant", lambda opt: get_constant_schedule_with_warmup(opt, WARMUP)),
])
def test_each_schedule_is_transformers_at_every_step(schedule: str, reference: object) -> None:
    ours = learning_rates(build_scheduler(optimizer(), Config(lr_schedule=schedule, warmup_steps=WARMUP), TOTAL),
                          TOTAL + 1)
    assert ours == learning_rates(reference(optimizer()), TOTAL + 1)  # type: ignore[operator]
    assert ours == pytest.approx([closed_form(schedule, step) for step in range(TOTAL + 1)], abs=1e-12)


def test_the_schedules_differ_after_the_warm_up_and_a_short_run_cuts_the_warm_up() -> None:
    rates = {s: learning_rates(build_scheduler(optimizer(), Config(lr_schedule=s, warmup_steps=WARMUP), TOTAL),
                               TOTAL) for s in ("linear", "cosine", "constant")}
    assert rates["linear"][:WARMUP + 1] == rates["cosine"][:WARMUP + 1] == rates["constant"][:WARMUP + 1]
    assert len({round(rates[s][TOTAL // 2], 9) for s in rates}) == 3
    short = learning_rates(build_scheduler(optimizer(), Config(warmup_steps=50), 8), 9)
    assert short == pytest.approx([closed_form("linear", step, warmup=8, total=8) for step in range(9)])


def test_an_unknown_schedule_is_refused_naming_the_choices() -> None:
    result = subprocess.run([sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--lr-schedule", "step"],
                            cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--lr-schedule" in result.stderr and "cosine" in result.stderr


def test_a_resume_with_another_schedule_is_refused(tmp_path: Path) -> None:
    def train(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
                               "--max-steps", "2", "--checkpoint-every", "2", *extra], cwd=REPO_ROOT,
                              env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)

    assert train().returncode == 0
    refused = train("--lr-schedule", "cosine", "--max-steps", "4")
    assert refused.returncode != 0
    assert "lr_schedule 'linear' -> 'cosine'" in refused.stderr and "--resume none" in refused.stderr


def test_early_stopping_needs_evaluations() -> None:
    with pytest.raises(ConfigError, match="early_stopping_patience=3 needs evaluations during the run: set eval_every"):
        Config(early_stopping_patience=3)
    assert Config(early_stopping_patience=3, eval_every=10).early_stopping_patience == 3


@pytest.mark.parametrize(("mode", "value", "best", "min_delta", "improves"), [
    ("max", 0.5, None, 0.1, True), ("max", 0.61, 0.5, 0.1, True), ("max", 0.6, 0.5, 0.1, False),
    ("max", 0.5, 0.5, 0.0, False), ("min", 0.39, 0.5, 0.1, True), ("min", 0.45, 0.5, 0.1, False),
    ("min", 0.49, 0.5, 0.0, True),
])
def test_an_improvement_for_early_stopping_beats_the_best_by_more_than_min_delta(
        mode: str, value: float, best: float | None, min_delta: float, improves: bool) -> None:
    assert BestMetric("metric", mode).improves(value, best, min_delta) is improves  # type: ignore[arg-type]
