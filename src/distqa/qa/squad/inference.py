"""A trained model's answers to SQuAD questions, on every rank: evaluation in training, and prediction.

Both run the model over the windows of a split of the SQuAD feature cache with
:func:`distqa.qa.inference.score_windows`
(the ranks share the windows and gather the few best spans of each; the same code as NQ's), with the spans kept
inside each window's context part. Decoding, per question: the best span over all of its windows, scored as its
start + end logit minus the null score (position 0) of its window, as text cut from the context by the tokens'
character offsets. The question is answered when that score beats the no-answer threshold, else given ``""``.

The threshold is tuned at every evaluation for the best F1 on the validation data (the official ``best_f1_thresh``,
:func:`distqa.qa.squad.metric.best_threshold`) unless ``no_answer_threshold`` fixes it, and is the ``squad`` task's
inference state: stored in the checkpoints, read back by :class:`SquadPredictor`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from torch import nn

from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime
from distqa.qa.inference import Reader, load_trained, score_windows
from distqa.qa.spans import WindowSpans
from distqa.qa.squad.cache import SquadWindows, open_examples
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.metric import best_threshold, question_scores, score_predictions
from distqa.qa.squad.prepared import find_squad_features, prepare_squad
from distqa.qa.squad.reader import hub_name, source_path
from distqa.tasks.base import BestMetric, Evaluation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SquadPrediction:
    """The best answer of one question, before the threshold decides whether it is given."""

    id: str
    text: str
    """The best span's text ("" when no window had a span)."""
    score: float
    """How far the best span beats the null answer of its window; -inf when no window had a span."""

    def answer(self, threshold: float) -> str:
        return self.text if self.score > threshold else ""


def decode_answers(spans: WindowSpans, windows: SquadWindows, examples: pa.Table) -> list[SquadPrediction]:
    """One :class:`SquadPrediction` per question of ``examples``, in order, from every window's best spans."""
    best = spans.score[:, 0]  # the spans of a window come best first
    example_index, context_start = windows.columns["example_index"], windows.columns["context_start"]
    bounds = np.searchsorted(example_index, np.arange(examples.num_rows + 1))  # windows come in question order
    offsets = windows.offsets()
    ids, contexts = examples.column("id").to_pylist(), examples.column("context").to_pylist()
    predictions = []
    for index, (question_id, context) in enumerate(zip(ids, contexts, strict=True)):
        own = np.arange(bounds[index], bounds[index + 1])
        window = int(own[np.argmax(best[own])]) if len(own) else -1
        if window < 0 or not np.isfinite(best[window]):
            predictions.append(SquadPrediction(question_id, "", -np.inf))
            continue
        first = int(spans.start[window, 0] - context_start[window])
        last = int(spans.end[window, 0] - context_start[window])
        characters = offsets[window]
        # Byte-level BPE and SentencePiece pieces carry the space before their word, and so may their offsets.
        text = context[characters[first, 0]:characters[last, 1]].strip()
        predictions.append(SquadPrediction(question_id, text, float(best[window])))
    return predictions


@dataclass(kw_only=True)
class SquadEvaluation(Evaluation):
    """``metrics``: the official names (exact, f1, total, HasAns_*, NoAns_*); ``state``: the threshold and span
    limit predict uses."""

    threshold: float
    answers: dict[str, str]


class SquadEvaluator:
    """Scores a model on one split of a SQuAD feature cache (the validation split in training) by the official F1,
    which picks ``best.pt``. Every rank must call :meth:`evaluate` together; all of them get the same result."""

    best_metric = BestMetric("f1", "max")

    def __init__(self, directory: Path, runtime: Runtime, batch_size: int, max_answer_len: int,
                 threshold: float | None = None, split: str = "validation") -> None:
        self.windows = SquadWindows(directory, split)
        self.examples = open_examples(directory, split)
        self.golds = dict(zip(self.examples.column("id").to_pylist(), self.examples.column("answer_text").to_pylist(),
                              strict=True))
        self.runtime, self.batch_size, self.max_answer_len = runtime, batch_size, max_answer_len
        self.threshold = threshold
        """Used as given when set; tuned at every evaluation when None."""

    def __len__(self) -> int:
        return self.examples.num_rows

    def evaluate(self, model: nn.Module, precision: Precision) -> SquadEvaluation:
        spans = score_windows(model, self.windows, self.runtime, precision, self.batch_size, self.max_answer_len)
        predictions = decode_answers(spans, self.windows, self.examples)
        threshold = self.threshold
        if threshold is None:
            f1 = np.array([question_scores(self.golds[p.id], p.text)[1] for p in predictions])
            answerable = np.array([bool(self.golds[p.id]) for p in predictions])
            threshold = best_threshold(np.array([p.score for p in predictions]), f1, answerable)
        answers = {p.id: p.answer(threshold) for p in predictions}
        metrics = score_predictions(self.golds, answers)
        parts = [f"{prefix} F1 {metrics[f'{prefix}_f1']:.2f}" for prefix in ("HasAns", "NoAns")
                 if f"{prefix}_f1" in metrics]
        summary = (f"F1 {metrics['f1']:.2f}, exact {metrics['exact']:.2f} on {metrics['total']} questions "
                   f"({', '.join(parts)}), no-answer threshold {threshold:.3f}")
        state = {"no_answer_threshold": threshold, "max_answer_len": self.max_answer_len}
        return SquadEvaluation(metrics=metrics, state=state, summary=summary, threshold=threshold, answers=answers)


class SquadPredictor(Reader):
    """A trained ``squad`` model with its tokenizer, window settings and no-answer threshold.

    In a notebook (one process)::

        predictor = SquadPredictor.from_checkpoint("results/squad-sample/checkpoints/best.pt", local_runtime("cpu"))
        predictor.answers(predictor.predict_file("data/squad-sample/dev.json"))   # {id: text, "" for none}
    """

    def __init__(self, model: nn.Module, config: SquadConfig, runtime: Runtime, threshold: float,
                 max_answer_len: int, evaluation: dict[str, Any] | None = None) -> None:
        super().__init__(model, config, runtime, max_answer_len, evaluation)
        self.threshold = threshold

    @classmethod
    def from_checkpoint(cls, path: Path | str, runtime: Runtime, threshold: float | None = None,
                        **overrides: Any) -> SquadPredictor:
        """Load ``best.pt`` or a ``step-*.pt``; ``overrides`` replace config values (None = keep)."""
        path = Path(path)
        model, config, checkpoint = load_trained(path, runtime, SquadConfig, **overrides)
        assert isinstance(config, SquadConfig)
        state = checkpoint.task_state or {}
        if threshold is None and "no_answer_threshold" not in state:
            log.warning("%s holds no tuned no-answer threshold (no evaluation ran in its training); using %s", path,
                        config.no_answer_threshold or 0.0)
        tuned = state.get("no_answer_threshold", config.no_answer_threshold or 0.0)
        threshold = float(threshold if threshold is not None else tuned)
        max_answer_len = int(state.get("max_answer_len", config.max_answer_len))
        log.info("loaded %s: no-answer threshold %.3f, max answer length %d", path, threshold, max_answer_len)
        return cls(model, config, runtime, threshold, max_answer_len, checkpoint.evaluation)

    def predict_file(self, source: Path | str) -> list[SquadPrediction]:
        """One :class:`SquadPrediction` per question of ``source`` (its answers, if any, not read), in file order."""
        if not hub_name(str(source)):
            source_path(str(source), "--input")
        directory = self.featurized(source, prepare_squad, find_squad_features)
        windows = SquadWindows(directory, "test")
        return decode_answers(self.window_spans(windows), windows, open_examples(directory, "test"))

    def answers(self, predictions: list[SquadPrediction]) -> dict[str, str]:
        """The official predictions file's object: ``{id: text}``, ``""`` where the threshold says no answer."""
        return {p.id: p.answer(self.threshold) for p in predictions}
