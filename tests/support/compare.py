"""What runs start and end with, and how two results compare: a run's first and last weights, the largest difference
between two state dicts, JSON-like values equal up to float rounding."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from distqa.config.sources import load_config
from distqa.distributed.rng import seed_everything
from distqa.tasks import make_task

from support.repo import MACHINERY_ARGS


def initial_weights(*args: str) -> dict[str, torch.Tensor]:
    """The weights a run of the machinery task with ``args`` starts from (built as distqa.train builds them)."""
    config = load_config([*MACHINERY_ARGS, *args], environ={}, dotenv_path=os.devnull)
    seed_everything(config.seed)
    return make_task(config).build_model().state_dict()


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    assert checkpoints, f"no checkpoint in {run_dir}"
    return torch.load(checkpoints[-1], map_location="cpu", weights_only=True)["model"]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_close_values(actual: Any, expected: Any, rel: float = 1e-6) -> None:
    """``actual`` equals ``expected`` (JSON-like: dicts, lists, strings, integers) except that floats need only agree to
    ``rel``: another CPU's kernels round the last bits their own way (a threshold tuned on logits differs by 3e-8)."""
    if isinstance(expected, float) or isinstance(actual, float):
        assert actual == pytest.approx(expected, rel=rel, abs=1e-9), (actual, expected)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (actual, expected)
        for key in expected:
            assert_close_values(actual[key], expected[key], rel)
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), (actual, expected)
        for got, want in zip(actual, expected, strict=True):
            assert_close_values(got, want, rel)
    else:
        assert actual == expected, (actual, expected)
