"""The QA tasks' commands through the dispatch: scoring an NQ or SQuAD file runs what their classes declare, with
neither torch nor transformers; format-2 checkpoints (before the task seam) name their task (the dispatch itself:
tests/test_commands.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from distqa import score
from distqa.checkpoint.format import save_checkpoint
from distqa.settings.task_commands import checkpoint_task
from distqa.tasks import task_class

from conftest import REPO_ROOT, clean_env

FORMAT_2_BEST = REPO_ROOT / "tests" / "fixtures" / "checkpoint-v2" / "best.pt"


def test_score_imports_no_task_for_the_qa_formats_and_runs_what_their_classes_declare(tmp_path: Path) -> None:
    """Scoring an NQ or SQuAD file needs neither torch nor transformers (the tasks' modules import both)."""
    for name, path in score.QA_SCORE_COMMANDS.items():
        assert task_class(name).commands["score"] == path
    gold = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-test-gold.jsonl"
    code = ("import sys; from distqa import score; "
            f"code = score.main(['--gold', {str(gold)!r}, '--submission', {str(tmp_path / 'none.csv')!r}]); "
            "print(code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "2 []", done.stdout + done.stderr
    assert done.stderr == f"distqa.score: error: {tmp_path / 'none.csv'}: no such submission file\n"


def test_format_2_checkpoints_name_their_task(tmp_path: Path) -> None:
    assert checkpoint_task(FORMAT_2_BEST) == "nq"  # format 2: config.dataset
    state = torch.load(FORMAT_2_BEST, weights_only=True)
    del state["config"]["dataset"]
    save_checkpoint(state, tmp_path / "no-dataset.pt")
    assert checkpoint_task(tmp_path / "no-dataset.pt") == "dummy"  # as distqa.checkpoint.format.from_format_2 reads it
