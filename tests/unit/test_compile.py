"""``--compile`` and ``--compile-mode`` (distqa.distributed.ddp): compiled by default on GPUs only, in the mode asked
for (that compiling leaves the results as they were: tests/qa/test_optimizations.py; its speed:
bench/optimizations.py)."""

from __future__ import annotations

import os

import pytest
import torch

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.distributed.ddp import compile_enabled, training_module
from distqa.distributed.runtime import local_runtime

from support.repo import MACHINERY_ARGS


def load(*flags: str):
    return load_config([*MACHINERY_ARGS, *flags], environ={}, dotenv_path=os.devnull)


@pytest.mark.parametrize(("setting", "device", "expected"), [
    (None, "cpu", False), (None, "cuda", True), (True, "cpu", True), (False, "cuda", False)])
def test_compile_is_on_by_default_on_gpus_only(setting: bool | None, device: str, expected: bool) -> None:
    config = load(*(["--compile", str(setting).lower()] if setting is not None else []))
    assert compile_enabled(config, torch.device(device)) is expected


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compile_mode_reaches_torch_compile(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """--compile-mode is torch.compile's mode (bench/gpu_mfu.py measures each on a GPU); another value is refused
    by the settings with the choices."""
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(torch, "compile", lambda module, **options: calls.append(options) or module)
    config = load("--compile", "true", "--compile-mode", mode)
    training_module(torch.nn.Linear(2, 2), local_runtime("cpu"), config)
    assert calls == [{"mode": mode}]
    with pytest.raises(ConfigError, match=r"compile_mode: invalid value 'fast' .*choose one of"):
        load("--compile-mode", "fast")
