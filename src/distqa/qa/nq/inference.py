"""Running a trained model over NQ windows on every rank: evaluation in training, and prediction.

Running the model over windows on every rank, the sampler's padding repeats dropped
(:func:`~distqa.qa.inference.score_windows`), and loading a checkpoint's model
(:func:`~distqa.qa.inference.load_trained`) are the QA package's, shared with SQuAD. :class:`Evaluator` scores
the validation windows; :class:`Predictor` answers any NQ file with a trained checkpoint (``python -m
distqa.predict``, ``python -m distqa.evaluate`` and ``notebooks/inference.ipynb`` use it). Decoding the gathered
spans into answers is :mod:`distqa.qa.nq.decode`'s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime
from distqa.qa.answers import Answer
from distqa.qa.inference import Reader, load_trained, score_windows
from distqa.qa.nq.cache import NQWindows, open_examples
from distqa.qa.nq.config import NQConfig
from distqa.qa.nq.decode import (
    Decoding,
    ExampleColumns,
    Prediction,
    Thresholds,
    WindowLayout,
    decode,
    golds_of,
    tune_thresholds,
)
from distqa.qa.nq.metric import score_answers
from distqa.qa.nq.prepared import find_features, prepare_nq
from distqa.tasks.base import BestMetric, Evaluation

log = logging.getLogger(__name__)


# --- evaluation on a labelled split ------------------------------------------------------------

@dataclass(kw_only=True)
class NQEvaluation(Evaluation):
    """``metrics``: score_answers' keys (micro_f1, long_f1, short_f1, precision, recall, tp, fp, fn, examples);
    ``state``: the :class:`~distqa.qa.nq.decode.Decoding` of the tuned thresholds, as a dict."""

    thresholds: Thresholds
    predictions: list[Prediction]


class Evaluator:
    """Scores a model on one labelled split of an NQ feature cache (the validation split in training), by the
    Kaggle micro-F1, which picks ``best.pt``.

    Every rank must call :meth:`evaluate` together (it gathers); all of them get the same result.
    """

    best_metric = BestMetric("micro_f1", "max")

    def __init__(self, directory: Path, runtime: Runtime, batch_size: int, max_answer_len: int,
                 long_threshold: float | None = None, short_threshold: float | None = None,
                 split: str = "validation") -> None:
        self.windows = NQWindows(directory, split)
        table = open_examples(directory, split)
        self.layout = WindowLayout.of(self.windows)
        self.examples = ExampleColumns.of(table)
        self.golds = golds_of(table)
        self.runtime, self.batch_size, self.max_answer_len = runtime, batch_size, max_answer_len
        self.long_threshold, self.short_threshold = long_threshold, short_threshold
        """Used as given when set; the ones left None are tuned at every evaluation."""

    def __len__(self) -> int:
        return len(self.examples.example_id)

    def evaluate(self, model: nn.Module, precision: Precision) -> NQEvaluation:
        spans = score_windows(model, self.windows, self.runtime, precision, self.batch_size, self.max_answer_len)
        predictions = decode(spans, self.layout, self.examples)
        thresholds = tune_thresholds(predictions, self.golds, self.long_threshold, self.short_threshold)
        answers = {p.example_id: p.answer(thresholds) for p in predictions}
        metrics = score_answers(self.golds, answers)
        summary = (f"micro-F1 {metrics['micro_f1']:.4f} (long {metrics['long_f1']:.4f}, short "
                   f"{metrics['short_f1']:.4f}; P {metrics['precision']:.4f} R {metrics['recall']:.4f}) on "
                   f"{metrics['examples']} examples, thresholds long {thresholds.long:.3f} "
                   f"short {thresholds.short:.3f}")
        return NQEvaluation(metrics=metrics, state=Decoding(thresholds, self.max_answer_len).to_dict(),
                            summary=summary, thresholds=thresholds, predictions=predictions)


# --- prediction with a trained checkpoint ----------------------------------------------------------

class Predictor(Reader):
    """A trained model with its tokenizer, window settings and decoding thresholds.

    In a notebook (one process)::

        predictor = Predictor.from_checkpoint("results/nq-sample/checkpoints/best.pt", local_runtime("cpu"))
        predictions = predictor.predict_file("data/nq-sample/simplified-nq-test.jsonl")
        predictor.answers(predictions)   # {example_id: Answer(long="start:end", short="start:end"|"YES"|"NO"|"")}
    """

    def __init__(self, model: nn.Module, config: NQConfig, runtime: Runtime, thresholds: Thresholds,
                 max_answer_len: int, evaluation: dict[str, Any] | None = None) -> None:
        super().__init__(model, config, runtime, max_answer_len, evaluation)
        self.thresholds = thresholds

    @classmethod
    def from_checkpoint(cls, path: Path | str, runtime: Runtime, long_threshold: float | None = None,
                        short_threshold: float | None = None, **overrides: Any) -> Predictor:
        """Load ``best.pt``, a ``step-*.pt`` or a directory written by ``python -m distqa.export``; ``overrides``
        replace config values (None = keep)."""
        path = Path(path)
        model, config, checkpoint = load_trained(path, runtime, NQConfig, **overrides)
        assert isinstance(config, NQConfig)
        decoding = Decoding.from_dict(checkpoint.task_state) if checkpoint.task_state else None
        if decoding is None and (long_threshold is None or short_threshold is None):
            log.warning("%s holds no tuned thresholds (no evaluation ran in its training); using 0: "
                        "answer when the best span beats [CLS]'s null score", path)
        tuned = decoding.thresholds if decoding is not None else Thresholds(0.0, 0.0)
        thresholds = Thresholds(long_threshold if long_threshold is not None else tuned.long,
                                short_threshold if short_threshold is not None else tuned.short)
        max_answer_len = decoding.max_answer_len if decoding is not None else config.max_answer_len
        log.info("loaded %s: thresholds long %.3f short %.3f, max answer length %d", path, thresholds.long,
                 thresholds.short, max_answer_len)
        return cls(model, config, runtime, thresholds, max_answer_len, checkpoint.evaluation)

    def predict_file(self, source: Path | str) -> list[Prediction]:
        """One :class:`~distqa.qa.nq.decode.Prediction` per example of ``source``, in file order."""
        directory = self.featurized(Path(source), prepare_nq, find_features)
        windows = NQWindows(directory, "test")
        return decode(self.window_spans(windows), WindowLayout.of(windows),
                      ExampleColumns.of(open_examples(directory, "test")))

    def answers(self, predictions: list[Prediction]) -> dict[int, Answer]:
        """The submission rows of ``predictions`` under this predictor's thresholds."""
        return {p.example_id: p.answer(self.thresholds) for p in predictions}
