"""The optimizer and the precision of a training step (distqa.training.optim): AdamW's weight decay on weight matrices
only, and the precision each device allows."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.distributed.precision import Precision
from distqa.training.optim import build_optimizer

from support.repo import MACHINERY_ARGS


class Block(nn.Module):
    """A transformer-like block's parameter kinds: a weight matrix with its bias, and a LayerNorm's gain and bias."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.LayerNorm = nn.LayerNorm(width)  # BERT's name for it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x))


def test_no_weight_decay_on_biases_and_layernorm() -> None:
    config = load_config([*MACHINERY_ARGS, "--weight-decay", "0.01"], environ={}, dotenv_path=os.devnull)
    model = nn.Sequential(nn.Embedding(50, 8), nn.ModuleList([Block(8), Block(8)]))
    optimizer = build_optimizer(model, config, torch.device("cpu"))
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == config.weight_decay == 0.01 and plain["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    plain_names = {names[id(p)] for p in plain["params"]}
    assert any("LayerNorm" in n for n in plain_names) and any(n.endswith("bias") for n in plain_names)
    assert not any("LayerNorm" in names[id(p)] or names[id(p)].endswith("bias") for p in decayed["params"])
    assert {names[id(p)] for p in decayed["params"]} == {"0.weight", "1.0.dense.weight", "1.1.dense.weight"}
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_precision_choice_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert Precision.choose("auto", cpu).dtype is None
    bf16 = Precision.choose("bf16", cpu)
    assert bf16.dtype == torch.bfloat16 and not bf16.scaler.is_enabled()
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        Precision.choose("fp16", cpu)
