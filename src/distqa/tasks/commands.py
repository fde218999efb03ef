"""How ``python -m distqa.predict|evaluate|score|export`` find the command they run: the task's own.

These commands read a task's answers, not its training, so each task brings its own (:attr:`Task.commands
<distqa.tasks.base.Task.commands>`: command name -> ``package.module:function``). The entry point finds the task
(a checkpoint's saved config: :mod:`distqa.checkpoint.commands`; score's ``--format``; without either, the task the
project's settings name: :func:`~distqa.config.sources.run_task`), imports that task's module and the module its
command names, and nothing else, then calls ``function(argv)`` with its whole command line. A task without the
command, or one that cannot be imported here (a fork that deleted ``distqa/qa``), is one line on stderr and exit
status 2.

Nothing here depends on a module path stored anywhere: a checkpoint holds its task's name or import path, which the
registry resolves as a run's ``--task`` does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from distqa.config import ConfigError
from distqa.config.errors import print_error
from distqa.config.registry import LIGHT_COMMANDS, task_class
from distqa.config.sources import run_task

Command = Callable[[Sequence[str] | None], int]
"""A task's command: its whole command line (None: ``sys.argv[1:]``) -> the exit status."""


def task_command(task: str, command: str) -> Command:
    """The function ``task`` (a registered name or ``package.module:ClassName``) declares for ``command``; a one-line
    ConfigError when the task cannot be imported, has no such command, or its path does not name a function."""
    chosen = task_class(task)
    path = chosen.commands.get(command)
    name = chosen.name or task
    if path is None:
        declared = f" (it has {', '.join(sorted(chosen.commands))})" if chosen.commands else ""
        raise ConfigError(f"task {name!r} has no {command} command{declared}: {chosen.__name__}.commands names "
                          f"none. A task declares its own as commands = {{{command!r}: 'package.module:function'}} "
                          "(distqa.tasks.base.Task.commands).")
    return import_command(path, name, command)


def import_command(path: str, task: str, command: str) -> Command:
    """The function at ``path`` (``package.module:function``), ``task``'s ``command``; a one-line ConfigError when
    it cannot be imported or is not a function."""
    module_name, _, function_name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name, None)
    except ImportError as err:
        raise ConfigError(f"task {task!r}: its {command} command {path}: importing {module_name} failed "
                          f"({type(err).__name__}: {err}).") from None
    if not callable(function):
        raise ConfigError(f"task {task!r}: its {command} command {path} is not a function in {module_name}; "
                          "commands maps a name to 'package.module:function'.")
    return function


def run_named_command(command: str, prog: str, argv: Sequence[str] | None, option: str) -> int:
    """``command`` of the task that ``option`` names in ``argv`` (by default the task the project's settings name:
    :func:`~distqa.config.sources.run_task`), called with ``argv``. A registered task's command listed in
    :data:`~distqa.config.registry.LIGHT_COMMANDS` is imported without the task's module."""
    early = argparse.ArgumentParser(prog=prog, add_help=False)
    early.add_argument(option)
    task = getattr(early.parse_known_args(argv)[0], option.lstrip("-").replace("-", "_"))
    try:
        task = task or run_task(sys.argv[1:] if argv is None else argv)
        light = LIGHT_COMMANDS.get(task, {}).get(command)
        function = import_command(light, task, command) if light else task_command(task, command)
    except ConfigError as err:
        print_error(f"{prog}: error: {err}")
        return 2
    return function(argv)
