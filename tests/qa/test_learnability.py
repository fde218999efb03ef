"""Learnability: the tiny model, trained with 2-process DDP on a learnable synthetic NQ task, answers it.

The task (``distqa.qa.nq.synthetic``; the exact arguments are in scripts/train_synthetic_nq.sh):
Wikipedia-like documents of 100-400 whitespace tokens with HTML structure (paragraphs, tables,
lists) hold fact sentences such as "The capital of the Northern River is Zürich ." The question names
an entity and an attribute ("what is the capital of the northern river"), and the answer is the value
(SHORT, one or two spans), the fact's block (LONG: "tell me about …"), YES/NO ("is the northern river
destroyed" against "The Northern River is (not) destroyed ."), or nothing when the entity is absent
(UNKNOWN). Distractor facts about other entities (some sharing a word with the asked one) and about
the same entity with another attribute make the model match both, and the answer's block sits
anywhere in the document, often beyond the first window. 10000 training examples, 10 % held out for
validation by example.

The script docs/EVALUATION.md gives for its expected numbers runs here as it is: generate, then the local
launcher (2 emulated nodes joined by a c10d rendezvous, gloo) trains 600 steps of 64 windows, with
evaluation on both ranks every 200 steps; then predict and score a separate 500-example test file.
About 4 minutes on 2 CPU cores. The run is deterministic (fixed seeds), so the threshold of 0.8 is
not a coin toss; docs/EVALUATION.md records what it reaches (0.85 validation, 0.84 test).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch

from support.processes import clean_env, free_port
from support.repo import REPO_ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.long
@pytest.mark.timeout(1500)  # above the run's own guard: the suite's 600 s would cut it first on a slow machine
def test_the_tiny_model_learns_the_synthetic_task_to_a_micro_f1_of_0_8(tmp_path: Path) -> None:
    result = subprocess.run(
        ["scripts/train_synthetic_nq.sh", "--data-dir", str(tmp_path / "data"), "--run-id", "learn",
         "--output-dir", str(tmp_path / "results"), "--nq-cache-dir", str(tmp_path / "cache"),
         "--", "--progress-bar", "false", "--tensorboard", "false"],
        cwd=REPO_ROOT, env=clean_env(RDZV_PORT=str(free_port())), capture_output=True, text=True,
        timeout=1200)  # a hang guard: 258 s quiet on a slow 2-core machine
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"

    evaluations = [float(f1) for f1 in re.findall(r"eval at step \d+: micro-F1 ([0-9.]+)", result.stderr)]
    assert len(evaluations) == 3, result.stderr[-3000:]
    assert evaluations[-1] >= 0.8, f"validation micro-F1 by evaluation: {evaluations}"

    run_dir = tmp_path / "results" / "learn"
    best = torch.load(run_dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)
    assert best["evaluation"]["micro_f1"] >= 0.8 and best["evaluation"]["examples"] == 1000
    test_score = json.loads((run_dir / "score.json").read_text())
    assert test_score["examples"] == 500
    assert test_score["micro_f1"] >= 0.75, test_score  # unseen examples of the same task
