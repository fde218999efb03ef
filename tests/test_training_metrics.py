"""Throughput and per-rank step times in the training log: the window's arithmetic, and a real 2-rank
run where one rank is slowed and rank 0's log and TensorBoard name it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from distqa.config import TINY_MODEL_DIR
from distqa.throughput import model_flops_per_token
from distqa.training_metrics import MetricsWindow, RankWindow, summarise

from conftest import FAST_ARGS, REPO_ROOT, clean_env

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


SLOW_RANK_1 = """
import os, sys, time
from distqa.model import QAModel

forward = QAModel.forward


def slow_on_rank_1(self, *args, **kwargs):  # a straggler: every forward of rank 1 takes 0.2 s longer
    if os.environ["RANK"] == "1":
        time.sleep(0.2)
    return forward(self, *args, **kwargs)


QAModel.forward = slow_on_rank_1
from distqa.train import main
sys.exit(main())
"""


@pytest.mark.distributed
def test_a_slow_rank_is_named_in_rank_0s_log_and_tensorboard(tmp_path: Path) -> None:
    script = tmp_path / "slow_rank_1.py"
    script.write_text(SLOW_RANK_1)
    args = [*FAST_ARGS, "--tensorboard", "true", "--global-batch-size", "16", "--max-steps", "6", "--log-every", "3",
            "--peak-tflops", "0.01", "--output-dir", str(tmp_path), "--run-name", "slow", "--checkpoint-every", "0"]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), *args], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "slow" / "logs" / "rank-0.log").read_text()
    steps = re.findall(r"step (\d)/6 .*\| ([\d.]+) samples/s \| (\d+) tokens/s \((\d+) padded\) \| MFU ([\d.]+) %", log)
    assert [s[0] for s in steps] == ["3", "6"], log
    for _, _, tokens, padded, mfu in steps:
        assert 0 < int(tokens) <= int(padded) and float(mfu) > 0
    assert re.search(r"step time by rank, p50/p95 ms over 3 steps .*: 0: \d+/\d+ local \d+/\d+, 1: ", log)
    stragglers = re.findall(r"straggler: rank (\d) \((.+?)\) takes (\d+) ms of local work", log)
    assert len(stragglers) == 1, "named once: the warm-up window (steps 1-3) names nobody"
    assert stragglers[0][0] == "1" and int(stragglers[0][2]) >= 200
    assert "straggler" not in (tmp_path / "slow" / "logs" / "rank-1.log").read_text()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = (tmp_path / "slow" / "tensorboard").iterdir()
    scalars = EventAccumulator(str(events)).Reload()
    assert {"train/tokens_per_s", "train/padded_tokens_per_s", "train/mfu"} <= set(scalars.Tags()["scalars"])
    local = {r: [e.value for e in scalars.Scalars(f"ranks/local_p50_ms/rank_{r}")] for r in (0, 1)}
    assert len(local[0]) == len(local[1]) == 2
    assert all(slow >= 200 > fast for slow, fast in zip(local[1], local[0], strict=True)), local
