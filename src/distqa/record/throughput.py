"""GPU peak FLOP/s and model-FLOPs utilisation (MFU, docs/PERFORMANCE.md); a task counts its model's FLOPs per
token (``Task.flops_per_token``; a transformers encoder's: ``encoders/flops.py``)."""

from __future__ import annotations

import re

# Dense bf16 tensor-core peak per GPU, in FLOP/s, from NVIDIA's datasheets (the "with sparsity"
# figures halved). Searched in order, so a specific name comes before the family it belongs to (the
# H100 NVL and PCIe cards are slower than the SXM H100, whose CUDA name is "NVIDIA H100 80GB HBM3").
# The V100 has no bf16: its figure is the fp16 tensor-core peak.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100\b.*\bPCIE\b", 756e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b", 989e12),
    (r"\bH200\b.*\bNVL\b", 835e12),
    (r"\bH200\b", 989e12),
    (r"\bA100\b", 312e12),
    (r"\bA10G\b", 125e12),
    (r"\bL4\b", 121e12),
    (r"\bV100\b", 125e12),
)
"""(regular expression on the upper-cased CUDA device name, dense bf16 FLOP/s), first match wins."""


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU named as ``torch.cuda.get_device_name`` names it; None if unknown."""
    name = device_name.upper()
    for pattern, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, name):
            return flops
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model-FLOPs utilisation: the fraction (0..1) of ``peak_flops`` that ``tokens_per_s`` tokens make."""
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops}")
    return tokens_per_s * flops_per_token / peak_flops
