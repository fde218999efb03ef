"""Throughput and per-rank step times in the training log: the window's arithmetic, the summary and its straggler;
the log lines of a fork's model that has no tokens and no FLOPs; and the last partial window of a run that stops
before its next log line (the 2-rank run with a slowed rank: tests/distributed/test_training_metrics.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from distqa.encoders.config import TINY_MODEL_DIR
from distqa.encoders.flops import model_flops_per_token
from distqa.record.metrics import (
    STRAGGLER_MIN_STEPS,
    MetricsWindow,
    RankWindow,
    StragglerWatch,
    count_with_unit,
    summarise,
)

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT, reviews

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def test_a_window_counts_real_and_padded_tokens_and_their_flops() -> None:
    model_config = AutoConfig.from_pretrained(TINY_MODEL_DIR)
    window = MetricsWindow(torch.device("cpu"), lambda seq_len: model_flops_per_token(model_config, seq_len))
    for lengths in ([5, 64], [64, 1]):  # two steps of 2 windows of 64 positions
        window.start_step()
        mask = torch.stack([torch.arange(64) < n for n in lengths]).long()
        window.count_batch({"attention_mask": mask})
        window.local_work_done()
        window.add(torch.tensor(2.0), torch.tensor(1.0))
    [mine] = window.flush()
    assert (mine.steps, mine.loss, mine.grad_norm) == (2, 2.0, 1.0)
    assert (mine.tokens, mine.padded_tokens) == (5 + 64 + 64 + 1, 4 * 64)
    assert mine.flops == 4 * 64 * model_flops_per_token(model_config, 64)
    assert 0 < mine.local_p50 <= mine.step_p50 <= mine.step_p95 <= mine.seconds


def rank(local_p50: float, tokens: float = 1000, flops: float = 1e12, seconds: float = 2.0) -> RankWindow:
    return RankWindow(loss=1.0, grad_norm=1.0, steps=10, step_p50=0.2, step_p95=0.25, local_p50=local_p50,
                      local_p95=local_p50, tokens=tokens, padded_tokens=2 * tokens, flops=flops, seconds=seconds)


def test_the_summary_adds_up_the_ranks_and_names_a_straggler() -> None:
    ranks = [rank(0.05), rank(0.05), rank(0.15), rank(0.055)]
    summary = summarise(ranks, global_batch_size=64, peak_flops_per_rank=1e12)
    assert summary.samples_per_s == 10 * 64 / 2.0
    assert (summary.tokens_per_s, summary.padded_tokens_per_s) == (4 * 1000 / 2.0, 4 * 2000 / 2.0)
    assert summary.mfu == pytest.approx(4e12 / 2.0 / 4e12)
    assert summary.straggler == 2 and summary.extremes == (0, 2)
    balanced = summarise([rank(0.05), rank(0.055)], global_batch_size=64, peak_flops_per_rank=None)
    assert balanced.straggler is None and balanced.mfu is None
    tiny_steps = summarise([rank(0.0001), rank(0.0005)], global_batch_size=64, peak_flops_per_rank=None)
    assert tiny_steps.straggler is None, "5 times slower, but by 0.4 ms: nothing worth a warning"


def window_of(local_p50: list[float], steps: int = 1) -> RankWindow:
    return summarise([RankWindow(loss=1.0, grad_norm=1.0, steps=steps, step_p50=0.2, step_p95=0.2, local_p50=t,
                                 local_p95=t, tokens=0, padded_tokens=0, flops=0, seconds=0.2 * steps)
                      for t in local_p50], global_batch_size=8, peak_flops_per_rank=None)


def test_a_straggler_is_named_when_the_same_rank_is_slow_for_enough_steps_and_then_not_in_every_window() -> None:
    watch, named = StragglerWatch(), []
    # Noise: every window has a slow rank, but never the same one for long (a window of one step each).
    for step in range(1, 200):
        slow = (step // 3) % 2  # rank 0 for 3 steps, then rank 1 for 3 steps, ...
        named.append(watch.observe(window_of([0.05, 0.09] if slow else [0.09, 0.05]), step))
    assert named == [None] * 199
    # A rank slow in every window: named once it has been for STRAGGLER_MIN_STEPS steps, then not again soon.
    for step in range(200, 400):
        if (rank_named := watch.observe(window_of([0.05, 0.09]), step)) is not None:
            named.append((step, rank_named))
    assert [n for n in named if n is not None] == [(199 + STRAGGLER_MIN_STEPS, 1)]
    # Windows of 10 steps: the same after two of them.
    watch = StragglerWatch()
    assert [watch.observe(window_of([0.05, 0.09], steps=10), step) for step in (10, 20, 30)] == [None, 1, None]


REGRESSION_TASK = """
import torch
from torch import nn
from distqa.tasks.base import Task


class Points(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(256, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.x[i].sum(0, keepdim=True)}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(4, 96), nn.Linear(96, 1)  # 4*96 + 96 + 96 + 1 = 577 parameters

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


class Regression(Task):
    name = "regression"
    input_names = ("x",)

    def train_dataset(self):
        return Points()

    def build_model(self):
        return MLP()

    def loss(self, output, batch):
        return nn.functional.mse_loss(output, batch["y"])

    def evaluator(self, runtime):
        return None
"""


def test_a_model_without_tokens_or_flops_logs_neither_and_its_parameters_in_units(tmp_path: Path) -> None:
    """A fork's task outside the checkout (a regression MLP: no attention_mask, no flops_per_token)."""
    (tmp_path / "regression_task.py").write_text(REGRESSION_TASK)
    result = subprocess.run([sys.executable, "-m", "distqa.train", "--task", "regression_task:Regression", "--preset",
                             "none", "--global-batch-size", "32", "--max-steps", "4", "--log-every", "2",
                             "--progress-bar", "false", "--tensorboard", "false", "--output-dir", str(tmp_path),
                             "--run-name", "mlp"], cwd=REPO_ROOT,
                            env=clean_env(OMP_NUM_THREADS="1", PYTHONPATH=str(tmp_path)),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "model MLP: 577 parameters" in result.stderr
    lines = [line for line in result.stderr.splitlines() if re.search(r"step \d/4 \|", line)]
    assert len(lines) == 2 and all("samples/s |" in line and "ms/step" in line for line in lines), lines
    assert "tokens/s" not in result.stderr and "MFU" not in result.stderr
    assert "peak-tflops" not in result.stderr, "no FLOPs counted: no advice to set a peak"


def test_counts_are_shown_with_units() -> None:
    assert [count_with_unit(n) for n in (0, 577, 999, 1_234, 625_800, 999_960, 3_400_000, 110_000_000,
                                             1_300_000_000)] == [
        "0", "577", "999", "1.2K", "625.8K", "1.0M", "3.4M", "110.0M", "1.3B"]


def test_a_run_that_stops_between_log_lines_logs_its_last_window_and_its_summary_matches_its_checkpoint(
        tmp_path: Path) -> None:
    """stop_at_step 7 with a log line every 3 steps: steps 7 is logged (the window of step 7 alone); the resumed
    run ends with --max-steps at the end of an epoch, and summary.json holds the final checkpoint's progress."""
    common = [*MACHINERY_ARGS, *reviews(tmp_path, 80), "--global-batch-size", "16", "--per-rank-batch-size", "16",
              "--max-steps", "8", "--log-every", "3", "--checkpoint-every", "0", "--output-dir", str(tmp_path),
              "--run-name", "partial"]  # 64 training texts / 16 per step: 4 steps per epoch, the run ends with epoch 1
    stopped = subprocess.run([sys.executable, "-m", "distqa.train", *common, "--stop-at-step", "7"], cwd=REPO_ROOT,
                             env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert re.findall(r"step (\d)/8 \|", stopped.stderr) == ["3", "6", "7"]
    assert "over 1 steps" in stopped.stderr.split("step 7/8")[1]
    ended = subprocess.run([sys.executable, "-m", "distqa.train", *common], cwd=REPO_ROOT,
                           env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=180)
    assert ended.returncode == 0, ended.stderr
    assert re.findall(r"step (\d)/8 \|", ended.stderr) == ["8"]
    summary = json.loads((tmp_path / "partial" / "summary.json").read_text())
    final = torch.load(tmp_path / "partial" / "checkpoints" / "step-00000008.pt", weights_only=True)["progress"]
    assert {key: summary[key] for key in final} == final
    assert (final["epoch"], final["samples_in_epoch"]) == (1, 64)
