"""Score a checkpoint on the validation split of its NQ feature cache; print the metrics as JSON.

One process, or all ranks of a torchrun job (they share the windows)::

    python -m distqa.evaluate --checkpoint results/nq-sample/checkpoints/best.pt
    torchrun --standalone --nproc-per-node 2 -m distqa.evaluate --checkpoint … --output answers.csv

The checkpoint's task runs it (its ``evaluate`` command, :attr:`distqa.tasks.base.Task.commands`). For an ``nq``
(or ``dummy``) checkpoint that is :func:`distqa.qa.nq.commands.evaluate`: the decoding thresholds are tuned again
unless both ``--long-threshold`` and ``--short-threshold`` are given, and ``--output`` also writes the answers as a
submission CSV; a ``squad`` checkpoint's, :func:`distqa.qa.squad.commands.evaluate`, scores it on the validation
split of its SQuAD feature cache with the official metrics and the no-answer threshold (``--output``: the
predictions JSON). A task without one is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.settings.task_commands import run_checkpoint_command

HELP_TASK = "nq"
"""The task whose command answers ``--help`` and usage errors when no ``--checkpoint`` is given."""


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("evaluate", "python -m distqa.evaluate", argv, HELP_TASK)


if __name__ == "__main__":
    sys.exit(main())
