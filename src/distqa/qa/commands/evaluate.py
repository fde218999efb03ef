"""The evaluate command of the question-answering tasks (``python -m distqa.evaluate`` runs it for their checkpoints).

An ``nq`` checkpoint (and a ``dummy`` one) is scored on the validation split of its NQ feature cache by
:class:`distqa.qa.nq.inference.Evaluator`, the one that training runs: the metrics and the decoding thresholds (tuned
again unless both ``--long-threshold`` and ``--short-threshold`` are given) as JSON; ``--output`` also writes the
answers as a submission CSV. A ``squad`` checkpoint is scored the same way on the validation split of its SQuAD
feature cache (:class:`distqa.qa.squad.inference.SquadEvaluator`): the official metrics and the no-answer threshold
(tuned again unless ``--no-answer-threshold`` is given); ``--output`` writes the predictions JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import distributed_runtime
from distqa.errors import DataError, print_error
from distqa.qa.commands.checkpoint_flags import add_checkpoint_settings, start_checkpoint_command
from distqa.qa.nq.config import NQConfig
from distqa.qa.nq.inference import Evaluator, Predictor
from distqa.qa.nq.metric import write_submission
from distqa.qa.nq.prepared import find_features
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.inference import SquadEvaluator, SquadPredictor
from distqa.qa.squad.metric import write_predictions
from distqa.qa.squad.prepared import find_squad_features
from distqa.settings.flags import setting_overrides

DESCRIPTION = "Score a checkpoint on the validation split of its NQ feature cache; print the metrics as JSON."

NQ_SETTINGS = ("nq_cache_dir", "nq_train_file", "long_threshold", "short_threshold", "eval_batch_size", "device")
SQUAD_SETTINGS = ("squad_cache_dir", "squad_train_file", "squad_validation_file", "no_answer_threshold",
                  "eval_batch_size", "device")
"""The settings evaluate takes from its flags, those of the checkpoint's task (an nq or dummy one's, a squad one's);
the others come from the checkpoint."""


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.evaluate", description=DESCRIPTION)
    parser.add_argument("--checkpoint", required=True, type=Path, help="best.pt or a step-*.pt")
    parser.add_argument("--split", default="validation", help="split of the feature cache (default: validation)")
    parser.add_argument("--output", type=Path, help="also write the answers as a submission CSV (rank 0); for a "
                        "squad checkpoint the predictions JSON")
    add_checkpoint_settings(
        parser, "settings (default: DISTQA_* variables, else the checkpoint's; thresholds left out are tuned)",
        NQ_SETTINGS, SQUAD_SETTINGS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    try:
        task = start_checkpoint_command(args, NQ_SETTINGS, SQUAD_SETTINGS)
        if task == "squad":
            return evaluate_squad(args)
        overrides = setting_overrides(args, NQ_SETTINGS, NQConfig, os.environ)
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
    except (ConfigError, DataError, FileNotFoundError) as err:
        print_error(f"distqa.evaluate: error: {err}")
        return 2
    return 0


def evaluate_squad(args: argparse.Namespace) -> int:
    """The official metrics of a squad checkpoint on a split of its feature cache (errors reach main's handler)."""
    overrides = setting_overrides(args, SQUAD_SETTINGS, SquadConfig, os.environ)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
