"""Score a checkpoint on its task's validation data, as training does; print the metrics as JSON.

One process, or all ranks of a torchrun job::

    python -m distqa.evaluate --checkpoint results/RUN/checkpoints/best.pt
    torchrun --standalone --nproc-per-node 2 -m distqa.evaluate --checkpoint … --output FILE

The checkpoint's task runs it (its ``evaluate`` command, :attr:`distqa.tasks.base.Task.commands`), and its command
line is that task's: ``--help`` shows the command of the task the project's settings name (``--task NAME --help``:
another's). The QA tasks' is :mod:`distqa.qa.commands.evaluate` (docs/EVALUATION.md). A task without one is one line
on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.checkpoint.commands import run_checkpoint_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("evaluate", "python -m distqa.evaluate", argv)


if __name__ == "__main__":
    sys.exit(main())
