"""Score answers against gold answers: the Kaggle NQ micro-F1 of a submission CSV, or the official SQuAD metrics of
a predictions JSON.

Natural Questions (the default ``--format nq``): a submission CSV against a train-format jsonl holding the same
examples with their annotations::

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

``--format`` names the task whose answers these are; that task's ``score`` command runs
(:attr:`distqa.tasks.base.Task.commands`; for ``nq`` and ``squad`` :mod:`distqa.qa.commands.score`). A task
without one is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.tasks.commands import run_named_command

QA_SCORE_COMMANDS = {"nq": "distqa.qa.commands.score:main", "squad": "distqa.qa.commands.score:main"}
"""The score command the nq and squad task classes declare (tests/test_commands.py checks that they agree), named
here so that scoring their files imports no task: a task's module imports torch and transformers, the scorer
neither (score starts in about 0.4 s of CPU, not 4)."""


def main(argv: Sequence[str] | None = None) -> int:
    return run_named_command("score", "distqa.score", argv, "--format", default="nq", known=QA_SCORE_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
