"""The best candidate spans of each window, for any extractive QA task: picked on the device from the model's
start and end logits (:func:`top_spans`, inside each window's document part: :func:`document_mask`), and the
ranks' results merged back into window order (:func:`merge_gathered`).

A span's score is ``start_logit[start] + end_logit[end]`` minus the null score ``start_logit[0] + end_logit[0]``
of the window's first token ([CLS], <s>): above 0 the window prefers the span to "no answer here". Only the
``TOP_K`` best starts and ends are paired, as in HF's ``utils_qa``. What a task makes of the spans (NQ's long and
short answers, SQuAD's text) is its own decoding: :mod:`distqa.qa.nq.decode`, :mod:`distqa.qa.squad.inference`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from distqa.qa.answers import AnswerType

TOP_K = 20
"""Best start and best end positions per window that are paired into candidate spans."""
SPANS_PER_WINDOW = 5
"""Candidate spans a window keeps (the best one, and fallbacks for the long answer)."""


class WindowSpans(NamedTuple):
    """The best candidate spans of each window (numpy on the host, torch on the device)."""

    score: Any
    """(windows, spans) float32: span score minus the null score; -inf where there is no span."""
    start: Any
    """(windows, spans) window position of the first wordpiece."""
    end: Any
    """(windows, spans) window position of the last wordpiece (inclusive)."""
    type_logits: Any
    """(windows, 5) answer-type logits, in :class:`AnswerType` order."""


def document_mask(document_begin: torch.Tensor, document_end: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(windows, seq_len) True at the positions of each window's document tokens: from ``document_begin`` up to
    ``document_end`` (exclusive), per window; the tokenizer's sequence ids put them there (the windows'
    :class:`~distqa.encoders.template.PairTemplate`)."""
    positions = torch.arange(seq_len, device=document_begin.device)
    return (positions >= document_begin[:, None]) & (positions < document_end[:, None])


def top_spans(start_logits: torch.Tensor, end_logits: torch.Tensor, doc_mask: torch.Tensor,
              type_logits: torch.Tensor, max_answer_len: int, spans: int = SPANS_PER_WINDOW,
              top_k: int = TOP_K) -> WindowSpans:
    """The ``spans`` best ``(start, end)`` of each window of a batch, scored against [CLS]."""
    start_logits, end_logits = start_logits.float(), end_logits.float()
    null = start_logits[:, 0] + end_logits[:, 0]
    minus_inf = torch.tensor(-math.inf, device=start_logits.device)
    top_k = min(top_k, start_logits.shape[1])
    start_score, start = torch.where(doc_mask, start_logits, minus_inf).topk(top_k, dim=1)
    end_score, end = torch.where(doc_mask, end_logits, minus_inf).topk(top_k, dim=1)
    # (batch, start candidate, end candidate)
    length = end[:, None, :] - start[:, :, None] + 1
    pair = start_score[:, :, None] + end_score[:, None, :]
    valid = (length >= 1) & (length <= max_answer_len) & pair.isfinite()
    pair = torch.where(valid, pair - null[:, None, None], minus_inf).flatten(1)
    score, best = pair.topk(min(spans, pair.shape[1]), dim=1)
    return WindowSpans(score, start.gather(1, best // top_k), end.gather(1, best % top_k), type_logits.float())


def merge_gathered(per_rank: list[list[tuple[np.ndarray, WindowSpans]]], num_windows: int) -> WindowSpans:
    """Every rank's results in window order, the sampler's padding repeats dropped."""
    parts = [part for rank_parts in per_rank for part in rank_parts]
    if not parts:
        empty = np.empty((0, SPANS_PER_WINDOW), dtype=np.float32)
        return WindowSpans(empty, empty.astype(np.int64), empty.astype(np.int64), np.empty((0, len(AnswerType))))
    index = np.concatenate([window for window, _ in parts])
    first, unique = np.unique(index, return_index=True)
    if len(first) != num_windows or first[0] != 0 or first[-1] != num_windows - 1:
        raise RuntimeError(f"evaluation covered {len(first)} of {num_windows} windows")
    return WindowSpans(*(np.concatenate([getattr(spans, name) for _, spans in parts])[unique]
                         for name in WindowSpans._fields))
