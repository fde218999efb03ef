"""The command line of ``python -m distqa.predict`` for the question-answering tasks' checkpoints, one for all: each
task's predict (:func:`distqa.qa.nq.commands.predict`, the dummy task's too; :func:`distqa.qa.squad.commands.predict`)
parses it here and writes its answers to every question of ``--input``, in its task's file format."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.config.errors import DataError
from distqa.qa.commands.checkpoint_flags import add_checkpoint_settings, run_checkpoint_command

log = logging.getLogger("distqa.predict")

DESCRIPTION = ("Answer every question of a file with a trained checkpoint: NQ jsonl to a Kaggle CSV, SQuAD to "
               "predictions JSON.")

NQ_SETTINGS = ("long_threshold", "short_threshold", "eval_batch_size", "device", "nq_cache_dir", "num_proc")
SQUAD_SETTINGS = ("no_answer_threshold", "eval_batch_size", "device", "squad_cache_dir", "num_proc")
SETTINGS = {"nq": NQ_SETTINGS, "squad": SQUAD_SETTINGS}
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
        SETTINGS)
    return parser


def run(argv: Sequence[str] | None, own: Sequence[str], predict: Callable[[argparse.Namespace], None]) -> int:
    """Predict's command line ``argv`` for a checkpoint of the task whose settings are ``own``: ``predict(args)``
    writes the file; a ConfigError or DataError is one line, exit status 2."""
    return run_checkpoint_command("predict", build_arg_parser(), argv, SETTINGS, own, predict,
                                  (ConfigError, DataError))
