"""``python -m distqa.predict|evaluate|export``: the task a checkpoint was trained on, read from its saved config,
and that task's command run (:mod:`distqa.tasks.commands` dispatches). A checkpoint holds its task's name or import
path.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.config.errors import print_error
from distqa.config.sources import run_task
from distqa.tasks.commands import Command, task_command

RUN_FILE = "distqa.json"
"""In a directory written by an ``export`` command (:mod:`distqa.qa.hf_format`): the run's config, with its task."""



def checkpoint_task(path: Path) -> str:
    """The task a checkpoint (a file, or a directory an export command wrote) was trained on, read from its saved
    config without loading its weights (a file is memory-mapped); a one-line ConfigError saying why otherwise."""
    # Here, not at the top: the entry points import this module, and featurising processes, which re-import their
    # entry point, should not import torch for nothing.
    import torch

    from distqa.checkpoint.format import STATE_FILE, is_sharded_checkpoint  # here too: it imports torch

    if is_sharded_checkpoint(path):  # a step-*.dcp directory: its config is in the state file beside the shards
        path = path / STATE_FILE
    if path.is_dir():
        run_file = path / RUN_FILE
        if not run_file.is_file():
            raise ConfigError(f"{path} is a directory without {RUN_FILE}: not one written by python -m distqa.export "
                              "(a plain transformers model has no answer-type head and no thresholds).")
        try:
            config = json.loads(run_file.read_text()).get("config")
        except (OSError, ValueError, AttributeError) as err:
            raise ConfigError(f"{run_file} is not readable ({type(err).__name__}: {err}); export the checkpoint "
                              "again with python -m distqa.export.") from None
    elif not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist; train first (see the README) or pass "
                          "results/<run>/checkpoints/best.pt or a directory written by python -m distqa.export")
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # damaged or foreign: the full load names what is wrong, in one line
            state = _load_for_the_reason(path)
        if isinstance(state, dict) and state.get("format_version") == 2:  # its config names no task: say what to do
            state = _load_for_the_reason(path)
        config = state.get("config") if isinstance(state, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} holds no saved config, so not its task: it was not written by distqa.train "
                          "(or python -m distqa.export).")
    task = config.get("task")
    if not isinstance(task, str):
        raise ConfigError(f"{path}: its saved config names the task {task!r}, not a task name or import path.")
    return task


def _load_for_the_reason(path: Path) -> object:
    """The checkpoint at ``path`` loaded in full, for the one line :func:`~distqa.checkpoint.format.load_checkpoint`
    raises about a damaged or foreign file (a digest that does not match, a version this distqa does not read)."""
    # Here, not at the top: only a checkpoint that does not memory-map needs the checkpoint module (and torch).
    from distqa.checkpoint.format import CheckpointError, ModelCheckpoint, load_checkpoint

    try:
        return {"config": load_checkpoint(path, ModelCheckpoint).config}
    except CheckpointError as err:
        raise ConfigError(str(err)) from None


def run_checkpoint_command(command: str, prog: str, argv: Sequence[str] | None) -> int:
    """``command`` of the task that the checkpoint in ``argv`` (``--checkpoint``) was trained on, called with
    ``argv``. Without a ``--checkpoint`` (``--help``, a usage error) that of the task the project's settings name
    (:func:`~distqa.config.sources.run_task`), whose parser says what the command takes; where that task cannot be
    imported, a parser of ``--checkpoint`` alone says it."""
    early = argparse.ArgumentParser(prog=prog, add_help=False)
    early.add_argument("--checkpoint", type=Path)
    checkpoint = early.parse_known_args(argv)[0].checkpoint
    try:
        if checkpoint is None:
            return _task_command_or_usage(run_task(sys.argv[1:] if argv is None else argv), command, prog, argv)(argv)
        return task_command(checkpoint_task(checkpoint), command)(argv)
    except ConfigError as err:
        print_error(f"{prog}: error: {err}")
        return 2


def _task_command_or_usage(task: str, command: str, prog: str, argv: Sequence[str] | None) -> Command:
    """``task``'s ``command``; where it has none or cannot be imported, a parser of ``--checkpoint`` alone answers
    ``argv`` (``--help``, or a usage error), as argparse does."""
    try:
        return task_command(task, command)
    except ConfigError as err:  # no task here has the command: say what the command needs, as argparse does
        usage = argparse.ArgumentParser(prog=prog, epilog=f"The other flags are those of the checkpoint's task's "
                                        f"{command} command (here, {err})")
        usage.add_argument("--checkpoint", required=True, type=Path, help="a checkpoint written by distqa.train")
        usage.parse_known_args(argv)  # exits: --checkpoint is missing, or --help was asked for
        raise
