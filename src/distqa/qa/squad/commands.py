"""The squad task's commands (``python -m distqa.predict|evaluate|score`` run them for a ``squad`` checkpoint and
``--format squad``; :attr:`distqa.qa.squad.task.SquadTask.commands`). Their command lines are the ones every QA task
shares (:mod:`distqa.qa.commands`).

predict: the input is a SQuAD .json, a .jsonl or .parquet in the Hugging Face schema, or hf:NAME:SPLIT (answers in
it are ignored); the predictions JSON is ``{question id: answer text}`` with ``""`` for no answer, using the
no-answer threshold tuned in training unless ``--no-answer-threshold`` says otherwise.

evaluate: the checkpoint is scored on the validation split of its SQuAD feature cache by
:class:`distqa.qa.squad.inference.SquadEvaluator`, the one that training runs: the official metrics and the no-answer
threshold (tuned again unless ``--no-answer-threshold`` is given) as JSON; ``--output`` writes the predictions JSON.

score: the official metrics of a predictions JSON against a file in the SQuAD schema (:mod:`distqa.qa.commands.score`).

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
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.metric import read_gold, read_predictions, score_predictions, write_predictions
from distqa.qa.squad.prepared import find_squad_features
from distqa.qa.squad.reader import hub_name, source_path


def predict(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.predict`` for a squad checkpoint: a file in the SQuAD schema to the predictions JSON."""
    return predict_command.run(argv, predict_command.SQUAD_SETTINGS, write_answers)


def write_answers(args: argparse.Namespace) -> None:
    # Here, not at the top: see the module's docstring.
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.squad.inference import SquadPredictor

    if not hub_name(str(args.input)):
        source_path(str(args.input), "--input")
    overrides = setting_overrides(args, predict_command.SQUAD_SETTINGS, SquadConfig, os.environ)
    with distributed_runtime(overrides.pop("device", "auto")) as runtime:
        predictor = SquadPredictor.from_checkpoint(args.checkpoint, runtime, overrides.pop("no_answer_threshold", None),
                                                   **overrides)
        answers = predictor.answers(predictor.predict_file(args.input))
        if runtime.is_main_process:
            write_predictions(args.output, answers)
            predict_command.log.info("wrote %s: %d questions, %d answered", args.output, len(answers),
                                     sum(map(bool, answers.values())))


def evaluate(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.evaluate`` for a squad checkpoint: the official metrics on its validation split."""
    return evaluate_command.run(argv, evaluate_command.SQUAD_SETTINGS, print_metrics)


def print_metrics(args: argparse.Namespace) -> None:
    # Here, not at the top: see the module's docstring.
    from distqa.distributed.precision import Precision
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.squad.inference import SquadEvaluator, SquadPredictor

    overrides = setting_overrides(args, evaluate_command.SQUAD_SETTINGS, SquadConfig, os.environ)
    threshold = overrides.pop("no_answer_threshold", None)
    with distributed_runtime(overrides.pop("device", "auto")) as runtime:
        predictor = SquadPredictor.from_checkpoint(args.checkpoint, runtime, **overrides)
        config = predictor.config
        directory = find_squad_features(config, predictor.tokenizer,
                                        hint=" (the training's), or pass --squad-cache-dir")
        evaluator = SquadEvaluator(directory, runtime, config.eval_batch_size, predictor.max_answer_len, threshold,
                                   split=args.split)
        evaluation = evaluator.evaluate(predictor.model, Precision.choose(config.precision, runtime.device))
        if runtime.is_main_process:
            print(json.dumps({**evaluation.metrics, "no_answer_threshold": evaluation.threshold}))
            if args.output:
                write_predictions(args.output, evaluation.answers)


def score(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.score --format squad``: the official metrics of ``--predictions`` against ``--gold``."""
    return score_command.run(argv, "squad", score_predictions_file)


def score_predictions_file(gold: Path, predictions: Path) -> dict[str, float | int]:
    golds = read_gold(gold)
    return score_predictions(golds, read_predictions(predictions, golds.keys()))
