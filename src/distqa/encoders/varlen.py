"""An encoder run on the real tokens of a batch only (variable-length attention, "unpadding", ``--unpad``; how it
works, its trade-offs and what the tests check: docs/PERFORMANCE.md, "Useful tokens: unpadding").

:func:`unpad` gathers the real tokens of every window into one row ``[1, T]`` and says where each window starts
(``cu_seqlens``, int32 ``[B+1]``, as FlashAttention's varlen kernels take them); the encoder runs on that row with
:data:`VARLEN_ATTENTION`, which reaches every attention layer through transformers' attention interface
(``AttentionInterface.register``, chosen by the model config's ``_attn_implementation``; the keyword arguments are
transformers' ``TransformersKwargs``, the names its own FlashAttention integration reads); :func:`pad_back` puts the
hidden states back at their ``[B, S, H]`` places.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.varlen import varlen_attn
from transformers import AttentionInterface, PreTrainedModel

VARLEN_ATTENTION = "distqa_varlen"
"""The name of :func:`varlen_attention` in transformers' attention interface (an encoder's ``attn_implementation``)."""

VARLEN_DTYPES = (torch.bfloat16, torch.float16)
"""The dtypes FlashAttention's varlen kernel takes; fp32 tensors take the per-window SDPA path."""


class Unpadded(NamedTuple):
    """A batch's real tokens in one row, and where they came from."""

    inputs: dict[str, torch.Tensor]
    """``input_ids``, ``position_ids`` (and ``token_type_ids`` when given) of shape ``[1, T]``."""
    indices: torch.Tensor
    """``[T]`` flat index of each real token in the ``[B * S]`` padded batch."""
    cu_seqlens: torch.Tensor
    """int32 ``[B+1]``: window ``i``'s tokens are ``cu_seqlens[i]:cu_seqlens[i+1]`` of the row."""
    max_length: int
    """The longest window's real tokens."""

    def attention_kwargs(self) -> dict[str, Any]:
        """The keyword arguments an encoder passes down to :func:`varlen_attention` (transformers' names)."""
        return {"cu_seq_lens_q": self.cu_seqlens, "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def unpad(input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
          first_position: int = 0) -> Unpadded:
    """The real tokens (``attention_mask`` 1) of a ``[B, S]`` batch in one ``[1, T]`` row. Windows are
    left-aligned (padding after the tokens, as every featuriser here writes them), so a window's positions are
    ``first_position, first_position + 1, …`` (RoBERTa's start after its padding id: ``first_position``)."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1, dtype=torch.int32)
    indices = mask.flatten().nonzero().squeeze(1)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask) + first_position
    inputs = {"input_ids": input_ids.flatten()[indices][None], "position_ids": positions.flatten()[indices][None]}
    if token_type_ids is not None:
        inputs["token_type_ids"] = token_type_ids.flatten()[indices][None]
    return Unpadded(inputs, indices, cu_seqlens, int(lengths.max()))


def pad_back(hidden: torch.Tensor, indices: torch.Tensor, batch_shape: torch.Size) -> torch.Tensor:
    """``[1, T, H]`` hidden states of :func:`unpad`'s row back at their places in a ``[B, S, H]`` tensor of zeros."""
    batch, seq_len = batch_shape
    padded = hidden.new_zeros(batch * seq_len, hidden.shape[-1])
    return padded.index_copy(0, indices, hidden[0]).view(batch, seq_len, -1)


def varlen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                     max_length_q: int | None = None, max_length_k: int | None = None,
                     sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract (``sdpa_attention_forward``'s): query/key/value
    ``[B, heads, S, head_dim]`` in, ``[B, S, heads, head_dim]`` out. With ``cu_seq_lens_q`` (an unpadded row,
    B = 1) each window attends to itself alone; without it (a batch with no padding) every row attends to all of
    itself. ``sliding_window`` (ModernBERT's local layers): a token sees the ones less than that many positions
    away, as in transformers' FlashAttention path (``window_size = sliding_window - 1`` each side). No attention
    dropout: the varlen kernel has none, and the unpad setting turns it off."""
    reach = sliding_window - 1 if sliding_window is not None else None
    if cu_seq_lens_q is None:
        band = _band(query.shape[-2], reach, query.device)
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=band, scale=scaling)
        return output.transpose(1, 2).contiguous(), None
    # [1, heads, T, d] -> [T, heads, d]: the varlen layout
    query, key, value = (tensor[0].transpose(0, 1) for tensor in (query, key, value))
    if query.is_cuda and query.dtype in VARLEN_DTYPES:
        window = {} if reach is None else {"window_size": (reach, reach)}
        output = varlen_attn(query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k,
                             scale=scaling, **window)
    else:
        output = _attention_per_window(query, key, value, cu_seq_lens_q, scaling, reach)
    return output[None], None


def _attention_per_window(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                          scaling: float | None, reach: int | None) -> torch.Tensor:
    """The block-diagonal attention of ``varlen_attn`` (``[T, heads, d]`` in and out) as SDPA over each window's
    own slice: for devices and dtypes without the varlen kernel."""
    bounds = cu_seqlens.tolist()
    outputs = []
    for start, end in itertools.pairwise(bounds):
        window = (t[start:end].transpose(0, 1) for t in (query, key, value))
        outputs.append(F.scaled_dot_product_attention(*window, attn_mask=_band(end - start, reach, query.device),
                                                      scale=scaling).transpose(0, 1))
    return torch.cat(outputs)


def _band(length: int, reach: int | None, device: torch.device) -> torch.Tensor | None:
    """``[length, length]`` True where two positions are at most ``reach`` apart; None (all) without a reach."""
    if reach is None or reach >= length - 1:
        return None
    positions = torch.arange(length, device=device)
    return (positions[:, None] - positions[None, :]).abs() <= reach


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention)


def supports_varlen(encoder: PreTrainedModel) -> bool:
    """Whether ``encoder``'s attention layers call the attention interface (transformers'
    ``_supports_attention_backend``; DeBERTa-v2's compute their own disentangled attention)."""
    return type(encoder)._supports_attention_backend
