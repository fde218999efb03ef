"""A trained QA model over a task's windows, on every rank: what NQ's and SQuAD's evaluation and prediction share.

:func:`score_windows` runs the model over any task's windows (a ``DistributedSampler`` deals them out, each rank
keeps the few best spans of each window, the ranks gather them, and the sampler's padding repeats are dropped);
:func:`load_trained` loads a checkpoint's model for prediction, and :class:`Reader` is what a task's predictor
holds and does before it decodes the spans into its own answers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from distqa.checkpoint.format import ModelCheckpoint
from distqa.config import ConfigError
from distqa.config.sources import saved_config
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime, all_gather_objects, barrier, on_device
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.collate import collate_trimmed
from distqa.qa.config import QAConfig
from distqa.qa.hf_format import load_model_checkpoint
from distqa.qa.model import INPUT_NAMES, build_model, forward
from distqa.qa.spans import WindowSpans, document_mask, merge_gathered, top_spans


class _IndexedWindows(Dataset):
    """Windows with their index, so gathered results can be put back in order and deduplicated."""

    def __init__(self, windows: Dataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {**self.windows[index], "window": index}


@torch.no_grad()
def score_windows(model: nn.Module, windows: Dataset, runtime: Runtime, precision: Precision,
                  batch_size: int, max_answer_len: int) -> WindowSpans:
    """Candidate spans of every window of ``windows``, computed over all ranks; the same on each rank. Spans lie
    in each window's document part, from ``windows.document_begin`` up to ``document_end`` (arrays by window:
    :class:`~distqa.qa.nq.cache.NQWindows`, :class:`~distqa.qa.squad.cache.SquadWindows`)."""
    bounds = torch.from_numpy(np.stack([windows.document_begin, windows.document_end], axis=1))
    dataset = _IndexedWindows(windows)
    sampler = DistributedSampler(dataset, num_replicas=runtime.world_size, rank=runtime.rank, shuffle=False)
    # Windows are only read, never compiled for: every batch is cut to its longest window.
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_trimmed,
                        pin_memory=runtime.device.type == "cuda")
    was_training = model.training
    model.eval()
    parts: list[tuple[np.ndarray, WindowSpans]] = []
    try:
        for batch in loader:
            inputs = on_device(batch, runtime.device, INPUT_NAMES)
            with precision.autocast():
                output = forward(model, inputs)
            begin, end = bounds[batch["window"]].to(runtime.device).unbind(dim=1)
            found = top_spans(output.start_logits, output.end_logits,
                              document_mask(begin, end, inputs["input_ids"].shape[1]),
                              output.answer_type_logits, max_answer_len)
            parts.append((batch["window"].numpy(), WindowSpans(*(t.cpu().numpy() for t in found))))
    finally:
        model.train(was_training)
    return merge_gathered(all_gather_objects(parts), len(dataset))


def load_trained(path: Path, runtime: Runtime, config_class: type[QAConfig],
                 **overrides: Any) -> tuple[nn.Module, QAConfig, ModelCheckpoint]:
    """The model of the checkpoint at ``path`` (``best.pt``, a ``step-*.pt`` or an exported directory) on the
    runtime's device, in eval mode, with its config (``overrides`` replace values; None = keep), which must be a
    ``config_class``; one ConfigError naming the file and the fix otherwise."""
    checkpoint = load_model_checkpoint(path)
    config = saved_config(checkpoint.config, device=runtime.device.type,
                          **{k: v for k, v in overrides.items() if v is not None})
    if not isinstance(config, config_class):
        raise ConfigError(f"{path} is a checkpoint of task {config.task!r}; predict and evaluate answer with "
                          "checkpoints of the question-answering tasks 'nq' and 'squad' only.")
    model = build_model(config, weights_from_checkpoint=True)
    model.load_state_dict(checkpoint.model)
    model.to(runtime.device).eval()
    return model, config, checkpoint


class Reader:
    """A trained model with its config, tokenizer and span limit, on every rank: what a task's predictor holds
    (:class:`distqa.qa.nq.inference.Predictor`, :class:`distqa.qa.squad.inference.SquadPredictor`). Under
    torchrun every rank reads the same file and gets the same result."""

    def __init__(self, model: nn.Module, config: QAConfig, runtime: Runtime, max_answer_len: int,
                 evaluation: dict[str, Any] | None = None) -> None:
        self.model, self.config, self.runtime, self.max_answer_len = model, config, runtime, max_answer_len
        self.evaluation = evaluation
        """The validation metrics stored with the checkpoint (its step included); None if it has none."""
        self.tokenizer = load_tokenizer(config)

    def featurized(self, source: Path | str, prepare: Callable[..., Path], find: Callable[..., Path]) -> Path:
        """The feature cache of ``source`` (unlabelled windows, every record checked) that the task's ``prepare``
        builds and ``find`` finds; rank 0 builds it while the others wait, so there is one writer per cache."""
        if self.runtime.is_main_process:
            prepare(self.config, self.tokenizer, source=source, labelled=False, on_bad_line="fail")
        barrier()
        return find(self.config, self.tokenizer, source, labelled=False)

    def window_spans(self, windows: Dataset) -> WindowSpans:
        """The best spans of every window of ``windows`` (:func:`score_windows`), in the config's precision."""
        precision = Precision.choose(self.config.precision, self.runtime.device)
        with torch.inference_mode():
            return score_windows(self.model, windows, self.runtime, precision, self.config.eval_batch_size,
                                 self.max_answer_len)
