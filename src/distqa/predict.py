"""Answer every question of a file with a trained checkpoint: NQ jsonl to a Kaggle CSV, SQuAD to predictions JSON.

The sample test file, on one process (CPU or one GPU)::

    python -m distqa.predict --checkpoint results/nq-sample/checkpoints/best.pt \\
        --input data/nq-sample/simplified-nq-test.jsonl --output submission.csv

Over all GPUs of a node (each rank scores a share of the windows; rank 0 writes the file)::

    torchrun --standalone --nproc-per-node gpu -m distqa.predict --checkpoint … --input … --output …

Score it against a train-format file of the same examples::

    python -m distqa.score --gold data/nq-sample/simplified-nq-test-gold.jsonl --submission submission.csv

A checkpoint of the ``squad`` task answers a file in the SQuAD schema (a SQuAD .json, a .jsonl or .parquet in the
Hugging Face schema, or hf:NAME:SPLIT; answers in it are ignored) and writes the official predictions JSON,
``{question id: answer text}`` with ``""`` for no answer, using the no-answer threshold tuned in training::

    python -m distqa.predict --checkpoint results/squad-sample/checkpoints/best.pt \\
        --input data/squad-sample/dev.json --output predictions.json
    python -m distqa.score --format squad --gold data/squad-sample/dev.json --predictions predictions.json

The checkpoint's task runs it (its ``predict`` command, :attr:`distqa.tasks.base.Task.commands`): for an ``nq``
(or ``dummy``) checkpoint :func:`distqa.qa.nq.commands.predict`, for a ``squad`` one
:func:`distqa.qa.squad.commands.predict`; their modules say what the input may be and what the file holds. A task
without one is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.settings.task_commands import run_checkpoint_command

HELP_TASK = "nq"
"""The task whose command answers ``--help`` and usage errors when no ``--checkpoint`` is given (the question-answering
tasks share one command line; it lists their flags)."""


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("predict", "python -m distqa.predict", argv, HELP_TASK)


if __name__ == "__main__":
    sys.exit(main())
