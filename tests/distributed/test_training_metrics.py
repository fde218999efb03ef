"""Per-rank step times in the training log of a real 2-rank run of the machinery task where one rank is slowed:
named once as a straggler by rank 0's log and in TensorBoard, with tokens/s and the MFU of the FLOPs a task declares,
and the same run with no rank slowed naming nobody."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from distqa.record.metrics import STRAGGLER_MIN_STEPS

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


SLOW_RANK_1 = """
import os, sys, time
from examples.text_classification.task import BagOfWords, TextClassification

forward = BagOfWords.forward


def slow_on_rank_1(self, *args, **kwargs):  # a straggler: every forward of rank 1 takes 0.2 s longer
    if os.environ["RANK"] == "1" and os.environ["SLOW"] == "1":
        time.sleep(0.2)
    return forward(self, *args, **kwargs)


def flops_per_token(self, model, seq_len):  # a task that declares its FLOPs (6 a parameter and a token): an MFU
    return 6.0 * sum(p.numel() for p in model.parameters())


BagOfWords.forward = slow_on_rank_1
TextClassification.flops_per_token = flops_per_token
from distqa.train import main
sys.exit(main())
"""


def test_a_slow_rank_is_named_once_in_rank_0s_log_and_in_tensorboard_and_noise_is_not(tmp_path: Path) -> None:
    """A log line every step (--log-every 1): rank 1 slowed in every forward is named once, after
    STRAGGLER_MIN_STEPS steps; the same run with no rank slowed names nobody."""
    script = tmp_path / "slow_rank_1.py"
    script.write_text(SLOW_RANK_1)
    steps_run = STRAGGLER_MIN_STEPS + 4

    def run(name: str, slow: bool) -> str:
        args = [*MACHINERY_ARGS, "--tensorboard", "true", "--global-batch-size", "16", "--max-steps", str(steps_run),
                "--log-every", "1", "--peak-tflops", "0.01", "--output-dir", str(tmp_path), "--run-name", name,
                "--checkpoint-every", "0"]
        result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", str(script), *args], cwd=REPO_ROOT,
                                env=clean_env(OMP_NUM_THREADS="1", SLOW="1" if slow else "0",
                                              PYTHONPATH=str(REPO_ROOT)),  # the script's folder is sys.path[0]
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "straggler" not in (tmp_path / name / "logs" / "rank-1.log").read_text()
        return (tmp_path / name / "logs" / "rank-0.log").read_text()

    log = run("slow", slow=True)
    steps = re.findall(r"step (\d+)/\d+ .*\| ([\d.]+) samples/s \| (\d+) tokens/s \((\d+) padded\) \| MFU ([\d.]+) %",
                       log)
    assert [int(s[0]) for s in steps] == list(range(1, steps_run + 1)), log
    for _, _, tokens, padded, mfu in steps:
        assert 0 < int(tokens) <= int(padded) and float(mfu) > 0
    assert re.search(r"step time by rank, p50/p95 ms over 1 steps .*: 0: \d+/\d+ local \d+/\d+, 1: ", log)
    stragglers = re.findall(r"straggler: rank (\d) \((.+?)\) takes (\d+) ms of local work .* for the last (\d+) steps",
                            log)
    assert len(stragglers) == 1, f"named once, not in each of the {steps_run} windows: {stragglers}"
    assert stragglers[0][0] == "1" and int(stragglers[0][2]) >= 200
    assert int(stragglers[0][3]) == STRAGGLER_MIN_STEPS  # steps 2-21: the warm-up window (step 1) names nobody
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = (tmp_path / "slow" / "tensorboard").iterdir()
    scalars = EventAccumulator(str(events)).Reload()
    assert {"train/tokens_per_s", "train/padded_tokens_per_s", "train/mfu"} <= set(scalars.Tags()["scalars"])
    local = {r: [e.value for e in scalars.Scalars(f"ranks/local_p50_ms/rank_{r}")] for r in (0, 1)}
    assert len(local[0]) == len(local[1]) == steps_run
    # rank 1 sleeps 0.2 s in each forward on top of the work both do: how long that work takes depends on the machine
    assert all(slow >= 200 and slow > fast for slow, fast in zip(local[1], local[0], strict=True)), local

    assert "straggler" not in run("even", slow=False)
