"""Answer every question of a file with a trained checkpoint, in its task's answer format.

On one process (CPU or one GPU)::

    python -m distqa.predict --checkpoint results/RUN/checkpoints/best.pt --input FILE --output ANSWERS

Over all GPUs of a node (each rank answers a share; rank 0 writes the file)::

    torchrun --standalone --nproc-per-node gpu -m distqa.predict --checkpoint … --input … --output …

Then score the answers with ``python -m distqa.score``. The checkpoint's task runs it (its ``predict`` command,
:attr:`distqa.tasks.base.Task.commands`), and its command line is that task's: ``--help`` shows the command of the
task the project's settings name (``--task NAME --help``: another's). The QA tasks' is
:mod:`distqa.qa.commands.predict` (their inputs and files: docs/EVALUATION.md). A task without one is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.checkpoint.commands import run_checkpoint_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("predict", "python -m distqa.predict", argv)


if __name__ == "__main__":
    sys.exit(main())
