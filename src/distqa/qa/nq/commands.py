"""The nq task's commands (``python -m distqa.predict|evaluate|score`` run them for an ``nq`` checkpoint, a ``dummy``
one, whose windows are NQ's, and ``--format nq``; :attr:`distqa.qa.nq.task.NQTask.commands`). Their command lines
are the ones every QA task shares (:mod:`distqa.qa.commands`).

predict: the input may be the test file (no annotations) or a train-format file (annotations are ignored). It is
featurised with the window settings and tokenizer the checkpoint was trained with, into the feature cache
(``--nq-cache-dir``; reused when the same file is predicted again). Every line must be valid: a submission needs a
row for every example. The decoding thresholds are the ones tuned on the validation split and stored in the
checkpoint, unless ``--long-threshold``/``--short-threshold`` say otherwise. The CSV has the header
``example_id,PredictionString`` and rows ``<id>_long`` and ``<id>_short`` in input order, with ``start:end``, ``YES``,
``NO`` or blank.

evaluate: the checkpoint is scored on the validation split of its NQ feature cache by
:class:`distqa.qa.nq.inference.Evaluator`, the one that training runs: the metrics and the decoding thresholds (tuned
again unless both ``--long-threshold`` and ``--short-threshold`` are given) as JSON; ``--output`` also writes the
answers as a submission CSV.

score: the Kaggle micro-F1 of a submission CSV against a train-format jsonl (:mod:`distqa.qa.commands.score`).

Torch and the model are imported where a checkpoint is read, not here: score needs neither, and predict's featurising
processes start with multiprocessing's spawn, which re-imports the modules their work is defined in.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from distqa.config.flags import setting_overrides
from distqa.qa.commands import evaluate as evaluate_command
from distqa.qa.commands import predict as predict_command
from distqa.qa.commands import score as score_command
from distqa.qa.nq.config import NQConfig
from distqa.qa.nq.metric import SubmissionError, read_gold, read_submission, score_answers, write_submission
from distqa.qa.nq.prepared import find_features
from distqa.qa.nq.reader import require_file


def predict(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.predict`` for an nq or dummy checkpoint: an NQ jsonl to a Kaggle submission CSV."""
    return predict_command.run(argv, predict_command.NQ_SETTINGS, write_answers)


def write_answers(args: argparse.Namespace) -> None:
    # Here, not at the top: see the module's docstring.
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.nq.inference import Predictor

    require_file(args.input)
    overrides = setting_overrides(args, predict_command.NQ_SETTINGS, NQConfig, os.environ)
    with distributed_runtime(overrides.pop("device", "auto")) as runtime:
        predictor = Predictor.from_checkpoint(args.checkpoint, runtime, overrides.pop("long_threshold", None),
                                              overrides.pop("short_threshold", None), **overrides)
        answers = predictor.answers(predictor.predict_file(args.input))
        if runtime.is_main_process:
            write_submission(args.output, answers)
            predict_command.log.info("wrote %s: %d examples, %d long and %d short answers", args.output, len(answers),
                                     sum(bool(a.long) for a in answers.values()),
                                     sum(bool(a.short) for a in answers.values()))


def evaluate(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.evaluate`` for an nq or dummy checkpoint: the Kaggle micro-F1 on its validation split."""
    return evaluate_command.run(argv, evaluate_command.NQ_SETTINGS, print_metrics)


def print_metrics(args: argparse.Namespace) -> None:
    # Here, not at the top: see the module's docstring.
    from distqa.distributed.precision import Precision
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.nq.inference import Evaluator, Predictor

    overrides = setting_overrides(args, evaluate_command.NQ_SETTINGS, NQConfig, os.environ)
    long_threshold, short_threshold = overrides.pop("long_threshold", None), overrides.pop("short_threshold", None)
    with distributed_runtime(overrides.pop("device", "auto")) as runtime:
        predictor = Predictor.from_checkpoint(args.checkpoint, runtime, **overrides)
        config = predictor.config
        directory = find_features(config, predictor.tokenizer, hint=" (the training's), or pass --nq-cache-dir")
        evaluator = Evaluator(directory, runtime, config.eval_batch_size, predictor.max_answer_len,
                              long_threshold, short_threshold, split=args.split)
        evaluation = evaluator.evaluate(predictor.model, Precision.choose(config.precision, runtime.device))
        if runtime.is_main_process:
            print(json.dumps({**evaluation.metrics, "long_threshold": evaluation.thresholds.long,
                              "short_threshold": evaluation.thresholds.short}))
            if args.output:
                write_submission(args.output, {p.example_id: p.answer(evaluation.thresholds)
                                               for p in evaluation.predictions})


def score(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.score --format nq``: the Kaggle micro-F1 of ``--submission`` against ``--gold``."""
    return score_command.run(argv, "nq", score_submission, errors=(SubmissionError,))


def score_submission(gold: Path, submission: Path) -> dict[str, float | int]:
    read_submission(submission)  # the format first: reading a large gold file takes minutes
    golds = read_gold(gold)
    return score_answers(golds, read_submission(submission, expected_ids=golds.keys()))
