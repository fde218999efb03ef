"""What evaluate and predict share: the settings a checkpoint's command takes as flags, and their first steps
(``.env``, each rank's logging, the checkpoint's task, a refusal of the other task's flags)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dotenv import load_dotenv

from distqa.qa.nq.config import NQConfig
from distqa.qa.squad.config import SquadConfig
from distqa.settings.flags import add_setting_flags, refuse_other_tasks_flags
from distqa.settings.sources import dotenv_file
from distqa.settings.task_commands import checkpoint_task


def add_checkpoint_settings(parser: argparse.ArgumentParser, title: str, nq_settings: Sequence[str],
                            squad_settings: Sequence[str]) -> None:
    """The settings flags of a command over a checkpoint: an NQ (and dummy) checkpoint's group titled ``title``,
    then the squad checkpoint's own ones, without defaults shown (they come from the checkpoint)."""
    overrides = parser.add_argument_group(title)
    add_setting_flags(overrides, nq_settings, NQConfig, aliases={"eval_batch_size": "--batch-size"},
                      show_defaults=False)
    squad = parser.add_argument_group("settings of a squad checkpoint (the same defaults)")
    add_setting_flags(squad, [name for name in squad_settings if name not in nq_settings], SquadConfig,
                      show_defaults=False)


def start_checkpoint_command(args: argparse.Namespace, nq_settings: Sequence[str],
                             squad_settings: Sequence[str]) -> str:
    """Read ``.env``, log with this process's rank, and return the task of ``args.checkpoint``, after refusing
    the flags that only the other task's checkpoint takes (ConfigError)."""
    # Here, not at the top: predict's featurising processes start with multiprocessing's spawn, which re-imports
    # the modules their work is defined in, and should not import torch for nothing.
    from distqa.distributed.runtime import read_torchrun_env, setup_logging

    load_dotenv(dotenv_file(), override=False)
    setup_logging(read_torchrun_env()["RANK"])
    task = checkpoint_task(args.checkpoint)
    refuse_other_tasks_flags(args, tuple(dict.fromkeys([*nq_settings, *squad_settings])),
                             squad_settings if task == "squad" else nq_settings,
                             f"{args.checkpoint} is of task {task!r}")
    return task
