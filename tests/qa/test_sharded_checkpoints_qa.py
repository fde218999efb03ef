"""A QA checkpoint written as a sharded directory (distqa.checkpoint.sharded) serves ``export``, ``predict`` and
``evaluate`` as the file does (the sharded checkpoints themselves: tests/distributed/test_sharded_checkpoints.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from distqa.checkpoint.format import ModelCheckpoint, TrainingCheckpoint, load_checkpoint
from distqa.checkpoint.sharded import ShardedCheckpointWriter, sharded_checkpoint_path
from distqa.config.sources import saved_config
from distqa.qa.hf_format import export_model, load_model_checkpoint
from distqa.qa.model import build_model

from support.compare import assert_close_values, max_difference
from support.processes import clean_env
from support.repo import REPO_ROOT

NQ_BEST = REPO_ROOT / "tests" / "fixtures" / "nq-checkpoint" / "best.pt"


def test_export_predict_and_evaluate_take_a_sharded_checkpoint_as_they_take_the_file(tmp_path: Path) -> None:
    """The weights of an NQ best.pt written as a sharded directory: ``python -m distqa.export --checkpoint DIR``
    exports the model the file's export holds (every tensor equal, logits to 1e-6), and ``predict --checkpoint DIR``
    writes the file's submission byte for byte, and ``evaluate --checkpoint DIR`` prints the file's evaluation."""
    saved = load_checkpoint(NQ_BEST, ModelCheckpoint)
    model = build_model(saved_config(saved.config), weights_from_checkpoint=True)
    model.load_state_dict(saved.model)
    fields = {name: getattr(saved, name) for name in ("config", "task_state", "evaluation", "progress", "versions")}
    rest = TrainingCheckpoint(**fields, model={}, optimizer={}, scheduler={}, scaler={}, rng=[], world_size=1,
                              saved_by_rank=0)
    ShardedCheckpointWriter(tmp_path, 3, torch.device("cpu"), background=False).submit_sharded(
        7, model, torch.optim.AdamW(model.parameters()), rest)
    result = subprocess.run([sys.executable, "-m", "distqa.export", "--checkpoint", str(sharded_checkpoint_path(
        tmp_path, 7)), "--output", str(tmp_path / "sharded")], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    export_model(load_model_checkpoint(NQ_BEST), tmp_path / "file")  # the file's export, as the command makes it
    exports = {name: load_model_checkpoint(tmp_path / name) for name in ("file", "sharded")}
    submission = tmp_path / "submission.csv"
    result = subprocess.run([sys.executable, "-m", "distqa.predict", "--checkpoint", str(sharded_checkpoint_path(
        tmp_path, 7)), "--input", "data/nq-sample/simplified-nq-test.jsonl", "--output", str(submission),
        "--nq-cache-dir", str(tmp_path / "cache")], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert submission.read_bytes() == (NQ_BEST.parent / "expected-submission.csv").read_bytes()
    # evaluate: the validation split of the cache the fixture's run used (prepared with its windows), the file's
    # evaluation byte for byte.
    cache = tmp_path / "train-cache"
    encoder = "tests/fixtures/nq-checkpoint/encoder"
    for command in (["distqa.prepare", "--task", "nq", "--model-name-or-path", encoder, "--max-seq-len", "64",
                     "--max-question-len", "16", "--doc-stride", "32", "--num-proc", "1"],
                    ["distqa.evaluate", "--checkpoint", str(sharded_checkpoint_path(tmp_path, 7))]):
        result = subprocess.run([sys.executable, "-m", *command, "--nq-cache-dir", str(cache)], cwd=REPO_ROOT,
                                env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    expected = json.loads((NQ_BEST.parent / "expected-evaluation.json").read_text())
    assert_close_values(json.loads(result.stdout), expected)
    assert max_difference(exports["sharded"].model, exports["file"].model) == 0
    assert exports["sharded"].task_state == exports["file"].task_state
    inputs = {"input_ids": torch.tensor([[1, 5, 9, 2, 7, 11, 2]]),
              "attention_mask": torch.ones(1, 7, dtype=torch.long), "token_type_ids": torch.tensor([[0] * 4 + [1] * 3])}
    logits = []
    for name in ("file", "sharded"):
        exported = build_model(saved_config(exports[name].config), weights_from_checkpoint=True)
        exported.load_state_dict(exports[name].model)
        with torch.no_grad():
            out = exported.eval()(**inputs)
        logits.append(torch.cat([out.start_logits, out.end_logits]))
    assert torch.allclose(logits[0], logits[1], atol=1e-6, rtol=0)
