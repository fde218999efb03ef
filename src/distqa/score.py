"""Score answers against gold answers with the score command of the task whose answers they are::

    python -m distqa.score --format TASK --gold GOLD --predictions ANSWERS

``--format`` names the task (by default the one the project's settings name: ``project.toml``'s ``[run] args``,
the preset, ``DISTQA_TASK``); its ``score`` command (:attr:`distqa.tasks.base.Task.commands`) reads the files,
prints the metrics as one JSON object and says what any problem is in one line, exit status 2. The QA tasks' command
line is :mod:`distqa.qa.commands.score` (its docstring gives the files and the metrics). A task without a score
command is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.tasks.commands import run_named_command


def main(argv: Sequence[str] | None = None) -> int:
    return run_named_command("score", "distqa.score", argv, "--format")


if __name__ == "__main__":
    sys.exit(main())
