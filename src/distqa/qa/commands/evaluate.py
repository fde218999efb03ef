"""The command line of ``python -m distqa.evaluate`` for the question-answering tasks' checkpoints, one for all:
each task's evaluate (:func:`distqa.qa.nq.commands.evaluate`, the dummy task's too;
:func:`distqa.qa.squad.commands.evaluate`) parses it here and scores its checkpoint on the validation split of the
task's feature cache, as training does, printing the metrics and the tuned thresholds as JSON."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.config.errors import DataError
from distqa.qa.commands.checkpoint_flags import add_checkpoint_settings, run_checkpoint_command

DESCRIPTION = "Score a checkpoint on the validation split of its NQ feature cache; print the metrics as JSON."

NQ_SETTINGS = ("nq_cache_dir", "nq_train_file", "long_threshold", "short_threshold", "eval_batch_size", "device")
SQUAD_SETTINGS = ("squad_cache_dir", "squad_train_file", "squad_validation_file", "no_answer_threshold",
                  "eval_batch_size", "device")
SETTINGS = {"nq": NQ_SETTINGS, "squad": SQUAD_SETTINGS}
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
        SETTINGS)
    return parser


def run(argv: Sequence[str] | None, own: Sequence[str], evaluate: Callable[[argparse.Namespace], None]) -> int:
    """Evaluate's command line ``argv`` for a checkpoint of the task whose settings are ``own``: ``evaluate(args)``
    prints the metrics; a ConfigError, DataError or missing file is one line, exit status 2."""
    return run_checkpoint_command("evaluate", build_arg_parser(), argv, SETTINGS, own, evaluate,
                                  (ConfigError, DataError, FileNotFoundError))
