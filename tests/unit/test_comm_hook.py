"""The bf16 gradient-compression hook (``--ddp-comm-hook bf16``): registered by the DDP wrap, really used for the
all-reduce (tests/qa/test_comm_hook_qa.py: 2 ranks of the QA model with it train to the weights of a run without it,
up to bf16 rounding).

Its speed over a slow link is measured by bench/comm_hook.py (docs/PERFORMANCE.md), not here.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from torch import nn

from distqa.config.sources import load_config
from distqa.distributed.ddp import wrap_ddp
from distqa.distributed.runtime import local_runtime

from support.repo import MACHINERY_ARGS


@pytest.mark.parametrize("hook", ["none", "bf16"])
def test_ddp_wrap_registers_the_hook_and_the_all_reduce_goes_through_it(hook: str, group_of_one: None) -> None:
    """With bf16, every gradient DDP hands back is a bf16 value (the all-reduce ran on bf16 tensors and was cast
    back into the fp32 bucket); without it, gradients keep their fp32 bits."""
    config = load_config([*MACHINERY_ARGS, "--ddp-comm-hook", hook], environ={}, dotenv_path=os.devnull)
    # wrap_ddp wraps only a distributed runtime; DDP itself is content with the group of one made above.
    runtime = dataclasses.replace(local_runtime("cpu"), world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp_model = wrap_ddp(model, runtime, config)
    assert isinstance(ddp_model, nn.parallel.DistributedDataParallel)
    registered = ddp_model._get_ddp_logging_data().get("comm_hook")  # what DDP reports in its own logs
    assert registered == ("_bf16_compress_hook" if hook == "bf16" else None)

    ddp_model(torch.randn(8, 16)).square().sum().backward()
    in_bf16 = [bool(torch.equal(p.grad, p.grad.bfloat16().float())) for p in model.parameters()]
    assert all(in_bf16) if hook == "bf16" else not all(in_bf16), in_bf16
