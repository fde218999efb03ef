"""The predict command of the question-answering tasks (``python -m distqa.predict`` runs it for their checkpoints).

An ``nq`` checkpoint (and a ``dummy`` one) answers an NQ jsonl with a Kaggle submission CSV, a ``squad`` checkpoint a
file in the SQuAD schema with the official predictions JSON; :mod:`distqa.predict` shows the commands.

For NQ, the input may be the test file (no annotations) or a train-format file (annotations are ignored).
It is featurised with the window settings and tokenizer the checkpoint was trained with, into the
feature cache (``--nq-cache-dir``; reused when the same file is predicted again). Every line must be
valid: a submission needs a row for every example. The decoding thresholds are the ones tuned on
the validation split and stored in the checkpoint, unless ``--long-threshold``/``--short-threshold``
say otherwise. The CSV has the header ``example_id,PredictionString`` and rows ``<id>_long`` and
``<id>_short`` in input order, with ``start:end``, ``YES``, ``NO`` or blank.

For SQuAD, the input is a SQuAD .json, a .jsonl or .parquet in the Hugging Face schema, or hf:NAME:SPLIT (answers in
it are ignored); the predictions JSON is ``{question id: answer text}`` with ``""`` for no answer, using the
no-answer threshold tuned in training unless ``--no-answer-threshold`` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.errors import DataError, print_error
from distqa.qa.commands.checkpoint_flags import add_checkpoint_settings, start_checkpoint_command
from distqa.qa.nq.config import NQConfig
from distqa.qa.nq.metric import write_submission
from distqa.qa.nq.reader import require_file
from distqa.qa.squad.config import SquadConfig
from distqa.qa.squad.metric import write_predictions
from distqa.qa.squad.reader import hub_name, source_path
from distqa.settings.flags import setting_overrides

log = logging.getLogger("distqa.predict")

DESCRIPTION = ("Answer every question of a file with a trained checkpoint: NQ jsonl to a Kaggle CSV, SQuAD to "
               "predictions JSON.")

NQ_SETTINGS = ("long_threshold", "short_threshold", "eval_batch_size", "device", "nq_cache_dir", "num_proc")
SQUAD_SETTINGS = ("no_answer_threshold", "eval_batch_size", "device", "squad_cache_dir", "num_proc")
SETTINGS = tuple(dict.fromkeys(NQ_SETTINGS + SQUAD_SETTINGS))
"""The settings predict takes from its flags (those of the checkpoint's task); the others come from the checkpoint."""


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.predict", description=DESCRIPTION)
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="best.pt or a step-*.pt written by distqa.train, or a directory written by "
                        "distqa.export")
    parser.add_argument("--input", required=True, type=Path, help="NQ jsonl: the test file or a train-format file; "
                        "for a squad checkpoint a file in the SQuAD schema (or hf:NAME:SPLIT)")
    parser.add_argument("--output", required=True, type=Path, help="submission CSV to write (rank 0); for a squad "
                        "checkpoint the predictions JSON")
    add_checkpoint_settings(
        parser, "settings (default: DISTQA_* variables, else the checkpoint's; the thresholds: its tuned ones)",
        NQ_SETTINGS, SQUAD_SETTINGS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Here, not at the top: featurising processes start with multiprocessing's spawn, which re-imports the
    # modules their work is defined in, and should not import torch and transformers for nothing.
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.nq.inference import Predictor

    args = build_arg_parser().parse_args(argv)
    try:
        task = start_checkpoint_command(args, NQ_SETTINGS, SQUAD_SETTINGS)
        if task == "squad":
            return predict_squad(args)
        require_file(args.input)
        overrides = setting_overrides(args, SETTINGS, NQConfig, os.environ)
        with distributed_runtime(overrides.pop("device", "auto")) as runtime:
            predictor = Predictor.from_checkpoint(args.checkpoint, runtime, overrides.pop("long_threshold", None),
                                                  overrides.pop("short_threshold", None), **overrides)
            answers = predictor.answers(predictor.predict_file(args.input))
            if runtime.is_main_process:
                write_submission(args.output, answers)
                log.info("wrote %s: %d examples, %d long and %d short answers", args.output, len(answers),
                         sum(bool(a.long) for a in answers.values()), sum(bool(a.short) for a in answers.values()))
    except (ConfigError, DataError) as err:
        print_error(f"distqa.predict: error: {err}")
        return 2
    return 0


def predict_squad(args: argparse.Namespace) -> int:
    """The predictions JSON of a squad checkpoint (ConfigError and DataError reach main's handler)."""
    # Here, not at the top, for the reason main gives.
    from distqa.distributed.runtime import distributed_runtime
    from distqa.qa.squad.inference import SquadPredictor

    if not hub_name(str(args.input)):
        source_path(str(args.input), "--input")
    overrides = setting_overrides(args, SQUAD_SETTINGS, SquadConfig, os.environ)
    with distributed_runtime(overrides.pop("device", "auto")) as runtime:
        predictor = SquadPredictor.from_checkpoint(args.checkpoint, runtime, overrides.pop("no_answer_threshold", None),
                                                   **overrides)
        answers = predictor.answers(predictor.predict_file(args.input))
        if runtime.is_main_process:
            write_predictions(args.output, answers)
            log.info("wrote %s: %d questions, %d answered", args.output, len(answers), sum(map(bool, answers.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
