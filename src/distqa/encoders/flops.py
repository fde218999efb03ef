"""Training FLOPs per token of a transformers encoder, for the MFU in the logs (what an encoder task's
``flops_per_token`` returns; the MFU itself is :mod:`distqa.record.throughput`'s).

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
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoModel, PretrainedConfig


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
