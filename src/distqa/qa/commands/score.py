"""The command line of ``python -m distqa.score`` for the question-answering tasks' answer files, one for all:
``--format`` names the task (``python -m distqa.score`` runs that task's score command,
:mod:`distqa.tasks.commands`),
whose score parses it here: the Kaggle NQ micro-F1 of a submission CSV (:func:`distqa.qa.nq.commands.score`), or the
official SQuAD metrics of a predictions JSON (:func:`distqa.qa.squad.commands.score`).

Natural Questions (``--format nq``; the default ``dummy`` task's answers are NQ's too): a submission CSV against a
train-format jsonl holding the same examples with their annotations::

    python -m distqa.score --gold data/nq-sample/simplified-nq-test-gold.jsonl --submission submission.csv

It prints one JSON object on stdout, ``{"micro_f1": ..., "long_f1": ..., "short_f1": ..., "precision": ...,
"recall": ..., "tp": ..., "fp": ..., "fn": ..., "examples": ...}``, and exits 0.

SQuAD (``--format squad``): the official predictions JSON ``{question id: answer text}`` against a file in the
SQuAD schema (a SQuAD v1.1/v2.0 .json, or a .jsonl or .parquet in the Hugging Face schema)::

    python -m distqa.score --format squad --gold data/squad-sample/dev.json --predictions predictions.json

It prints one JSON object with the official evaluation's names and numbers (percentages): ``exact``, ``f1``,
``total``, and ``HasAns_exact``, ``HasAns_f1``, ``HasAns_total`` / ``NoAns_*`` where there are such questions.

Any problem with either file prints one line ``distqa.score: error: <file>:<where>: ...`` on stderr and exits 2;
nothing is skipped, since a skipped row or gold line would change the score. The metrics themselves are
:mod:`distqa.qa.nq.metric` (NQ) and :mod:`distqa.qa.squad.metric` (SQuAD).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from distqa.config.errors import DataError

ANSWERS = {"nq": "submission", "squad": "predictions"}
"""``--format`` -> the flag of its answers file (a format's score refuses the others')."""

Scorer = Callable[[Path, Path], Mapping[str, float | int]]
"""A format's metrics of (gold file, answers file)."""


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distqa.score", description="Score a Kaggle NQ submission CSV (micro F1 over long and short rows) or "
        "SQuAD predictions (the official exact match and F1).",
        epilog="Prints one JSON object on stdout. Errors: one line on stderr, exit status 2.")
    parser.add_argument("--format", choices=tuple(ANSWERS), default="nq",
                        help="nq: a Kaggle submission CSV (the default); squad: the official predictions JSON")
    parser.add_argument("--gold", required=True, type=Path,
                        help="nq: train-format jsonl of the submission's examples, with annotations; squad: the "
                        "questions in the SQuAD schema, with their answers")
    parser.add_argument("--submission", type=Path,
                        help="nq: CSV with header example_id,PredictionString and rows <id>_long, <id>_short")
    parser.add_argument("--predictions", type=Path,
                        help="squad: JSON object {question id: answer text}, \"\" for no answer")
    return parser


def run(argv: Sequence[str] | None, format_: str, scorer: Scorer, errors: tuple[type[Exception], ...] = ()) -> int:
    """Score's command line ``argv`` for ``--format format_``: ``scorer(gold, answers)`` printed as JSON; a
    DataError, OSError or one of ``errors`` is one line, exit status 2."""
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    answers = ANSWERS[format_]
    if getattr(args, answers) is None:
        parser.error(f"the following arguments are required: --{answers}")
    for other, unused in ANSWERS.items():
        if unused != answers and getattr(args, unused) is not None:
            parser.error(f"--{unused} is for --format {other}; give --{answers}")
    try:
        for path, what in ((args.gold, "gold"), (getattr(args, answers), answers.rstrip("s"))):
            if not path.is_file():
                raise DataError(f"{path}: no such {what} file")
        result = scorer(args.gold, getattr(args, answers))
    except (DataError, OSError, *errors) as err:
        print(f"{parser.prog}: error: {str(err).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0
