"""Score answers against gold answers with the score command of the task whose answers they are.

    python -m distqa.score --gold data/nq-sample/simplified-nq-test-gold.jsonl --submission submission.csv
    python -m distqa.score --format squad --gold data/squad-sample/dev.json --predictions predictions.json

``--format`` (default ``nq``) names the task; its ``score`` command (:attr:`distqa.tasks.base.Task.commands`) reads
the files, prints the metrics as one JSON object and says what any problem is in one line, exit status 2. For the
QA tasks that is :func:`distqa.qa.nq.commands.score` or :func:`distqa.qa.squad.commands.score`, whose command
line is :mod:`distqa.qa.commands.score` (its docstring gives the files and the metrics). A task without
a score command is one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.settings.task_commands import run_named_command

QA_SCORE_COMMANDS = {"nq": "distqa.qa.nq.commands:score", "squad": "distqa.qa.squad.commands:score"}
"""The score command the nq and squad task classes declare (tests/unit/test_commands.py checks that they agree), named
here so that scoring their files imports no task: a task's module imports torch and transformers, the scorer
neither (score starts in about 0.4 s of CPU, not 4)."""


def main(argv: Sequence[str] | None = None) -> int:
    return run_named_command("score", "distqa.score", argv, "--format", default="nq", known=QA_SCORE_COMMANDS)


if __name__ == "__main__":
    sys.exit(main())
