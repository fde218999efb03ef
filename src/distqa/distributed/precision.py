"""Mixed precision of one run: the autocast dtype and the loss scaler, chosen from ``precision`` and the device."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from distqa.config import ConfigError


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
