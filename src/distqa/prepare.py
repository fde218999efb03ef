"""Build once what a task reads before training (a feature cache, say): what the run's task's ``build_data`` builds.

The task is the run's, chosen as ``python -m distqa.train`` chooses it (``--task``, ``DISTQA_TASK``, the preset's
``task``; ``dummy`` by default, which has nothing to build and says so in one line)::

    python -m distqa.prepare --preset NAME --num-proc 16

It reads the settings the way ``python -m distqa.train`` does (preset, .env, DISTQA_*, flags), so the
training run finds the cache by the same fingerprint; its flags (``--task NAME --help``) are those that
determine the cache and how it is built (the task's ``prepare_sections``). Re-running with unchanged input,
tokenizer and window settings reuses the cache at once; changing any of them builds a new one. Run it before
launching a multi-process training: ranks never featurise while others wait in a collective. Prints the cache
directory on stdout; the summary goes to the log (stderr). With ``--only-if-needed`` (what the launchers pass,
followed by the trainer's arguments) it accepts every flag of training and does nothing, silently, when that
run's task builds nothing (its ``build_data`` returns None). The QA tasks' caches: their pages in docs/.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dotenv import load_dotenv

from distqa.config import ConfigError
from distqa.config.errors import SKIP_ADVICE, BadRecordError, DataError
from distqa.config.flags import prepare_sections, train_sections
from distqa.config.sources import dotenv_file, load_config
from distqa.tasks import available_tasks, make_task


def main(argv: Sequence[str] | None = None) -> int:
    load_dotenv(dotenv_file(), override=False)
    # Not distqa.distributed.runtime's logging: that imports torch, and each featurising process re-imports
    # this module (multiprocessing's spawn), which should stay light.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    argv = list(sys.argv[1:] if argv is None else argv)
    # The launchers pass the trainer's own arguments with this flag: prepare what that run will read.
    for_training = "--only-if-needed" in argv
    argv = [arg for arg in argv if arg != "--only-if-needed"]
    try:
        config = load_config(argv, prog="python -m distqa.prepare",
                             sections=train_sections if for_training else prepare_sections, description=(
            "Build what the run's task reads before training (a feature cache; the task is chosen as train "
            "chooses it). With --only-if-needed, the arguments are a training command line (all of "
            "train's flags): prepare what that run reads."),
            # Alone, it reads the data at once, in one process: the reader names a missing file.
            check_data_paths=for_training)
        # The task is imported here, not at the top: it imports torch, and each featurising process re-imports
        # this module (multiprocessing's spawn); they need only the tokenizers library.
        task = make_task(config)
        # Whatever flags prepare shows (prepare_sections), build_data alone says whether there is anything to
        # build: a fork's task may build data and declare no sections.
        directory = task.build_data()
    except (ConfigError, DataError) as err:
        advice = f" {SKIP_ADVICE}" if isinstance(err, BadRecordError) else ""
        print(f"distqa.prepare: error: {err}{advice}", file=sys.stderr)
        return 2
    except OSError as err:  # the cache directory is not writable, the disk is full, …
        print(f"distqa.prepare: error: {err}; check that folder and the free space there.", file=sys.stderr)
        return 1
    if directory is None:
        if for_training:  # the launchers' call before every run: nothing to say
            return 0
        logging.getLogger("distqa.prepare").info(
            "task %r has nothing to build before training (its data is made as it is read); to build another "
            "task's data, name it with --task (registered: %s)", config.task, ", ".join(available_tasks()))
        return 0
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
