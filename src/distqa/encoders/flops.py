"""Training FLOPs per token of a transformers encoder, for the MFU in the logs (what an encoder task's
``flops_per_token`` returns; the MFU itself is :mod:`distqa.record.throughput`'s): ``6 × N + 12 × L × h × s``
(the PaLM paper's appendix B, Chowdhery et al. 2022; Megatron-LM, Narayanan et al. 2021), each term explained in
docs/PERFORMANCE.md, "Throughput, MFU and slow ranks in the logs".

``N`` is counted on the encoder's own modules (:func:`non_embedding_parameters`), so every family's layers count as
they are, with no formula to keep in step (ModernBERT's gated feed-forward, ELECTRA's embedding projection, DeBERTa's
relative-position LayerNorm). The attention term is kept as it is for every family: ModernBERT's local layers compute
it in full under SDPA and eager (their window is a mask); DeBERTa's disentangled attention adds position terms that
it leaves out.
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
