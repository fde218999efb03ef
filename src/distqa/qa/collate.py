"""Batching windows: stack them, then cut the padding that no window of the batch needs.

Every window is stored padded to ``max_seq_len`` (``[CLS] question [SEP] document [SEP] [PAD]…``), but the
windows of short documents (and the last window of each long one) end early. :func:`collate_trimmed`
pads a batch only to its longest window, rounded up to a multiple of :data:`LENGTH_MULTIPLE` (tensor-core
friendly shapes, and few distinct shapes for ``torch.compile``), so the model skips the positions that
are padding in every row. Padding positions are masked everywhere they are read (attention, the span
loss, decoding), so the result equals the padded one up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

LENGTH_MULTIPLE = 8
SEQUENCE_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
"""The columns with one value per position; every other column (labels, indices) is per window."""
INPUT_NAMES = SEQUENCE_COLUMNS
"""The batch columns the model reads, in the order of :meth:`~distqa.qa.model.QAModel.forward`'s arguments: the
sequence columns."""


def collate_trimmed(windows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """``default_collate`` of ``windows``, then every sequence column cut after the last position that
    the attention mask of some window covers (rounded up to a multiple of 8, at most the stored length)."""
    batch = default_collate(windows)
    stored = batch["attention_mask"].shape[1]
    used = batch["attention_mask"].any(dim=0).nonzero()
    longest = int(used[-1]) + 1 if len(used) else 1
    length = min(stored, -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    if length < stored:
        for name in SEQUENCE_COLUMNS:
            if name in batch:
                batch[name] = batch[name][:, :length].contiguous()
    return batch


def collate_for(trim_padding: bool) -> Callable[[Sequence[Mapping[str, Any]]], Any]:
    """The loaders' ``collate_fn`` for the ``trim_padding`` setting."""
    return collate_trimmed if trim_padding else default_collate
