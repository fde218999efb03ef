"""Export a trained checkpoint as a Hugging Face directory that ``transformers`` loads offline.

::

    python -m distqa.export --checkpoint results/nq-sample/checkpoints/best.pt --output results/nq-sample/model

Then, with no network and nothing of this repository::

    from transformers import AutoModelForQuestionAnswering, pipeline
    model = AutoModelForQuestionAnswering.from_pretrained("results/nq-sample/model")
    answer = pipeline("question-answering", model="results/nq-sample/model")(question=..., context=...)

and ``python -m distqa.predict --checkpoint results/nq-sample/model …`` writes the same file as from ``best.pt``
(the answer-type head, the tuned thresholds and the run's config are in the directory too). What the
directory holds: :mod:`distqa.qa.hf_format`. To publish it on a model hub: ``hf upload ORG/NAME DIR`` (the
``huggingface_hub`` CLI, after ``hf auth login``), or ``model.push_to_hub`` after loading it.

The checkpoint's task runs it (its ``export`` command, :attr:`distqa.tasks.base.Task.commands`; for every
question-answering task :mod:`distqa.qa.commands.export`). A task without one is one line on stderr and exit
status 2, as is a checkpoint that cannot be read.

Exit status: 0 when written; 2 with one line on stderr when the checkpoint cannot be read or exported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from distqa.settings.task_commands import run_checkpoint_command

HELP_TASK = "nq"
"""The task whose command answers ``--help`` and usage errors when no ``--checkpoint`` is given."""


def main(argv: Sequence[str] | None = None) -> int:
    return run_checkpoint_command("export", "python -m distqa.export", argv, HELP_TASK)


if __name__ == "__main__":
    sys.exit(main())
