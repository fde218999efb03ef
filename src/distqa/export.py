"""Export a trained checkpoint in its task's format for use outside this repository::

    python -m distqa.export --checkpoint results/RUN/checkpoints/best.pt --output results/RUN/model

The checkpoint's task runs it (its ``export`` command, :attr:`distqa.tasks.base.Task.commands`), and its command
line is that task's: ``--help`` shows the command of the task the project's settings name. The QA tasks write a
Hugging Face directory that ``transformers`` loads offline (:mod:`distqa.qa.commands.export`,
:mod:`distqa.qa.hf_format`). A task without one is one line on stderr and exit status 2, as is a checkpoint that
cannot be read.

Exit status: 0 when written; 2 with one line on stderr when the checkpoint cannot be read or exported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.checkpoint.commands import run_checkpoint_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("export", "python -m distqa.export", argv)


if __name__ == "__main__":
    sys.exit(main())
