"""What evaluate and predict share: the settings a checkpoint's command takes as flags, its first steps (``.env``,
each rank's logging, the checkpoint's task, a refusal of another task's flags) and its one-line errors.

One command line serves the checkpoints of every QA task, so each task's flags are there, and those of a task
other than the checkpoint's are refused in one line. The tasks' config classes (the flags' help and types) are
found through the registry (:func:`distqa.tasks.task_class`), not imported: nq and squad do not import each other,
and each one's commands import this module; a task a fork left out has no flags here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from dotenv import load_dotenv

from distqa.checkpoint.commands import checkpoint_task
from distqa.config.errors import print_error
from distqa.config.flags import add_setting_flags, refuse_other_tasks_flags
from distqa.config.sources import dotenv_file
from distqa.tasks import available_tasks, task_class

TaskSettings = Mapping[str, Sequence[str]]
"""Task name -> the settings its checkpoint's command takes from flags (the others come from the checkpoint)."""


def add_checkpoint_settings(parser: argparse.ArgumentParser, title: str, settings: TaskSettings) -> None:
    """The settings flags of a command over a checkpoint, without defaults shown (they come from the checkpoint):
    the first task's group titled ``title`` (nq's, which the dummy task's checkpoints take too), then each other
    task's own ones, of the tasks here."""
    here = set(available_tasks())
    shown: set[str] = set()
    for task, names in settings.items():
        if task not in here:
            continue
        group = parser.add_argument_group(f"settings of a {task} checkpoint (the same defaults)" if shown else title)
        add_setting_flags(group, [name for name in names if name not in shown], task_class(task).config_class,
                          aliases={"eval_batch_size": "--batch-size"}, show_defaults=False)
        shown.update(names)


def run_checkpoint_command(command: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                           settings: TaskSettings, own: Sequence[str], run: Callable[[argparse.Namespace], None],
                           errors: tuple[type[Exception], ...]) -> int:
    """``argv`` parsed by ``parser`` (the command line of ``command`` that ``settings`` describes), the first steps,
    then ``run(args)`` for the checkpoint's task, whose settings are ``own``. ``errors``: one line
    ``distqa.<command>: error: ...`` on stderr, exit status 2."""
    args = parser.parse_args(argv)
    try:
        start_checkpoint_command(args, settings, own)
        run(args)
    except errors as err:
        print_error(f"distqa.{command}: error: {err}")
        return 2
    return 0


def start_checkpoint_command(args: argparse.Namespace, settings: TaskSettings, own: Sequence[str]) -> None:
    """Read ``.env``, log with this process's rank, and refuse (ConfigError) the flags of ``settings`` that are not
    ``own``, the checkpoint's task's, naming the task of ``args.checkpoint``."""
    # Here, not at the top: predict's featurising processes start with multiprocessing's spawn, which re-imports
    # the modules their work is defined in, and should not import torch for nothing.
    from distqa.distributed.runtime import read_torchrun_env, setup_logging

    load_dotenv(dotenv_file(), override=False)
    setup_logging(read_torchrun_env()["RANK"])
    every = tuple(dict.fromkeys(name for names in settings.values() for name in names))
    refuse_other_tasks_flags(args, every, own, f"{args.checkpoint} is of task {checkpoint_task(args.checkpoint)!r}")
