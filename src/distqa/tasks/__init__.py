"""The task seam: the interface a task implements (:mod:`distqa.tasks.base`), the registry of tasks by name
(:mod:`distqa.config.registry`, re-exported here: the settings read it, so it sits in their package) and the
dispatch of a task's commands (:mod:`distqa.tasks.commands`). Importing this package imports no torch and no task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distqa.config import Config
from distqa.config.registry import REGISTERED, available_tasks, other_tasks_settings, task_class

if TYPE_CHECKING:
    from distqa.tasks.base import Task

__all__ = ["REGISTERED", "available_tasks", "make_task", "other_tasks_settings", "task_class"]


def make_task(config: Config) -> Task:
    """The task of ``config`` (its ``task`` setting), built over it."""
    return task_class(config.task)(config)  # type: ignore[return-value]  # the registry checked it extends Task
