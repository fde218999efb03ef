"""Training FLOPs per token, GPU peak FLOP/s and model-FLOPs utilisation (MFU).

The FLOPs of one training token (forward + backward) follow the PaLM paper's appendix B (Chowdhery et
al. 2022) and Megatron-LM (Narayanan et al. 2021):

    flops_per_token = 6 × N + 12 × L × h × s

- ``N``: the non-embedding parameters, counted on the encoder's own modules (:func:`non_embedding_parameters`):
  every parameter but its embedding tables (``nn.Embedding``: a lookup is no matmul) and its pooler (our
  model drops it). For BERT that is each of the ``L`` layers' Q, K, V and output projections (4·h² + 4·h),
  feed-forward pair (2·h·I + I + h) and two LayerNorms (4·h), plus the embeddings' LayerNorm (2·h);
  for the other families whatever their layers hold (ModernBERT's gated feed-forward, ELECTRA's embedding
  projection, DeBERTa's relative-position LayerNorm), with no formula to keep in step. Each parameter
  costs 2 FLOPs per token forward (a multiply and an add) and 4 backward (gradients of the input and of
  the weight): 6 in all. The QA heads are left out (7·h parameters, under 0.01 % of BERT-base's layers).
- ``12 × L × h × s``: attention's two matmuls that have no parameters, Q·Kᵀ and softmax·V, each
  2·h·s FLOPs per token forward in every layer (``s`` = the sequence length the model runs on,
  padding included), times 3 for forward + backward. Kept as it is for every family: ModernBERT's local
  layers compute it in full under SDPA and eager (their window is a mask), DeBERTa's disentangled
  attention adds position terms that it leaves out.

MFU = tokens/s × flops_per_token / peak FLOP/s, with the tokens the model runs on (padding included,
since the hardware computes them) and the dense (not 2:4 sparse) bf16 tensor-core peak of the device.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig

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

def non_embedding_parameters(encoder: nn.Module) -> int:
    """The parameters of ``encoder`` that every token's computation multiplies: all of them but its embedding
    tables (every ``nn.Embedding``) and its pooler (which :class:`~distqa.qa.model.QAModel` drops)."""
    skipped = {id(p) for module in encoder.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    pooler = getattr(encoder, "pooler", None)
    if isinstance(pooler, nn.Module):
        skipped |= {id(p) for p in pooler.parameters()}
    return sum(p.numel() for p in encoder.parameters() if id(p) not in skipped)


def encoder_on_meta(model_config: PretrainedConfig) -> nn.Module:
    """The ``transformers`` encoder of ``model_config`` on the meta device: its modules and parameter shapes,
    no memory, no initialisation cost."""
    with torch.device("meta"):
        return AutoModel.from_config(model_config)


def model_flops_per_token(encoder: nn.Module | PretrainedConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token: 6 × non-embedding params + 12 × layers × hidden × seq_len.

    ``encoder``: the model's ``transformers`` encoder (its ``config`` gives layers and hidden size), or an
    encoder config, counted on a meta-device instance of it."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    if isinstance(encoder, PretrainedConfig):
        encoder = encoder_on_meta(encoder)
    model_config = encoder.config
    attention_scores = 12 * model_config.num_hidden_layers * model_config.hidden_size * seq_len
    return float(6 * non_embedding_parameters(encoder) + attention_scores)


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
