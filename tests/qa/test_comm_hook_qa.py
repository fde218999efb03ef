"""The bf16 gradient-compression hook on the QA model (tests/unit/test_comm_hook.py checks that the DDP wrap registers
it and that the all-reduce goes through it): 2 ranks train to the weights of a run without it, up to bf16 rounding.
The bound is the QA encoder's: a bag of words (the machinery task) has many embedding rows whose gradients are zero
but for rounding, where Adam's update flips sign."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distqa.config.sources import load_config
from distqa.distributed.rng import seed_everything
from distqa.qa.model import build_model

from support.compare import max_difference
from support.qa import FAST_ARGS
from support.runs import run_training

STEPS = 3


@pytest.mark.distributed
def test_two_ranks_with_the_bf16_hook_end_near_but_not_at_the_weights_of_plain_ddp(tmp_path: Path) -> None:
    """2 gloo ranks, fp32, 3 AdamW steps from the same weights on the same data. With the hook the weights
    differ from plain DDP's (the all-reduce really was compressed), by what bf16 rounding explains: bf16 keeps
    8 significant bits (a relative error of at most 2^-9 per rounding, a few roundings per gradient), so the
    weights' updates and Adam's first moments (running means of the averaged gradients) agree to 2^-7,
    norm-wise over the whole model. Element-wise bounds would not hold: where the two ranks' gradients nearly
    cancel, or are zero but for rounding (the attention keys' biases, to which softmax is blind), the
    rounding error is as large as the gradient itself."""
    def train(hook: str) -> dict[str, dict]:
        run_training([*FAST_ARGS, "--output-dir", str(tmp_path), "--run-name", hook, "--precision", "fp32",
                      "--global-batch-size", "8", "--per-rank-batch-size", "4", "--max-steps", str(STEPS),
                      "--checkpoint-every", "0", "--dropout", "0", "--lr", "5e-4", "--max-grad-norm", "0",
                      "--ddp-comm-hook", hook], nproc=2)
        checkpoint = torch.load(sorted((tmp_path / hook / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
        assert checkpoint["config"]["ddp_comm_hook"] == hook and checkpoint["world_size"] == 2
        return checkpoint

    plain, compressed = train("none"), train("bf16")
    initial = _initial_weights(tmp_path)
    difference = max_difference(plain["model"], compressed["model"])
    assert difference > 0, "the bf16 hook changed nothing: was it registered?"

    updates = [(plain["model"][name] - weight, compressed["model"][name] - weight) for name, weight in initial.items()]
    update_error = _relative(updates)
    assert update_error < 2**-7, f"the weights' updates differ by {update_error:.2e} (norm-wise, relative)"
    moments = [(plain["optimizer"]["state"][i]["exp_avg"], compressed["optimizer"]["state"][i]["exp_avg"])
               for i in plain["optimizer"]["state"]]
    moment_error = _relative(moments)
    assert 0 < moment_error < 2**-7, f"Adam's first moments differ by {moment_error:.2e} (norm-wise, relative)"


def _relative(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """||b - a|| / ||a|| over all pairs (a, b) together."""
    error = sum(float((b.float() - a.float()).square().sum()) for a, b in pairs)
    size = sum(float(a.float().square().sum()) for a, _ in pairs)
    return (error / size) ** 0.5


def _initial_weights(tmp_path: Path) -> dict[str, torch.Tensor]:
    """The weights both runs start from (the model built from FAST_ARGS' seed)."""
    config = load_config([*FAST_ARGS, "--dropout", "0"], environ={}, dotenv_path=tmp_path / "none.env")
    seed_everything(config.seed)
    return build_model(config).state_dict()
