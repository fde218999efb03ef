"""Optimizer, learning-rate schedule and mixed precision."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from torch import nn
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from distqa.config import Config, ConfigError

log = logging.getLogger(__name__)


def build_optimizer(model: nn.Module, config: Config, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only: biases and LayerNorm gains (the 1-d tensors)
    are not decayed, as in BERT. The fused kernel does the update in one launch where available."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999), eps=1e-8, fused=fused)


def build_scheduler(optimizer: torch.optim.Optimizer, config: Config,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then ``lr_schedule``: linear or cosine decay to 0 at
    ``total_steps``, or constant."""
    warmup = min(config.warmup_steps, total_steps)
    if config.lr_schedule == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    decay = {"linear": get_linear_schedule_with_warmup, "cosine": get_cosine_schedule_with_warmup}
    return decay[config.lr_schedule](optimizer, warmup, total_steps)


@dataclass
class Precision:
    """Autocast dtype and loss scaler for one run; ``dtype=None`` means full fp32."""

    dtype: torch.dtype | None
    device_type: str
    scaler: torch.amp.GradScaler

    @classmethod
    def choose(cls, requested: str, device: torch.device) -> Precision:
        """auto: bf16 on GPUs that support it, fp16 + loss scaling on older GPUs, fp32 on CPU
        (CPU autocast is slower than fp32 on most CPUs, so it runs only when asked for)."""
        cuda = device.type == "cuda"
        if requested == "auto":
            requested = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
        if requested == "fp16" and not cuda:
            raise ConfigError("precision=fp16 needs a CUDA GPU; use bf16 or fp32 on CPU.")
        dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[requested]
        # Only fp16 needs loss scaling (its exponent range is too small for small gradients).
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        return cls(dtype=dtype, device_type=device.type, scaler=scaler)

    @property
    def name(self) -> str:
        return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)
