"""The task seam, and what a fork may import: ``from distqa.tasks import Task, Config, Runtime, DataError, ...``.

:data:`__all__` names it all, in one place (docs/FORKING.md, "What a fork imports"; tests/unit/test_structure.py
pins it): the interface a task implements (:mod:`distqa.tasks.base`), the settings it declares with, the errors of
bad input, and the rank's runtime. These names stay put from release to release; a change to them is a
CHANGELOG.md entry. The package also holds the registry of tasks by name (:mod:`distqa.config.registry`, re-exported
here: the settings read it, so it sits in their package) and the dispatch of a task's commands
(:mod:`distqa.tasks.commands`).

Importing this package imports no torch and no task: a name of the API that needs torch is imported when first used
(PEP 562), so that the registry stays as light as the settings that read it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distqa.config import Config, ConfigError, Section, resolve_path
from distqa.config.errors import BadRecordError, DataError

# The registry, for the machinery's callers (not a fork's: a fork names its task by import path).
from distqa.config.registry import REGISTERED as REGISTERED
from distqa.config.registry import available_tasks as available_tasks
from distqa.config.registry import other_tasks_settings as other_tasks_settings
from distqa.config.registry import task_class as task_class

if TYPE_CHECKING:  # for type checkers and editors; at run time these load on first use (they import torch)
    from distqa.distributed import (
        Precision,
        Runtime,
        all_gather_objects,
        all_gather_tensor,
        all_reduce_mean,
        barrier,
        broadcast_object,
        on_device,
    )
    from distqa.tasks.base import Batch, BestMetric, Evaluation, Evaluator, Task

__all__ = [  # noqa: RUF022  (grouped by what a task uses them for, not sorted)
    # the seam a task implements
    "Task", "Batch", "BestMetric", "Evaluation", "Evaluator",
    # the settings it declares with, and the errors of bad input (one line each, exit 2)
    "Config", "Section", "ConfigError", "resolve_path", "DataError", "BadRecordError",
    # the rank's runtime
    "Runtime", "Precision", "all_gather_tensor", "all_gather_objects", "all_reduce_mean", "broadcast_object",
    "barrier", "on_device",
]
"""What a fork may import from here: the names that stay put from release to release."""

_IMPORTS_TORCH = {"distqa.tasks.base": ("Task", "Batch", "BestMetric", "Evaluation", "Evaluator"),
                  "distqa.distributed": ("Runtime", "Precision", "all_gather_tensor", "all_gather_objects",
                                         "all_reduce_mean", "broadcast_object", "barrier", "on_device")}
_HOME = {name: module for module, names in _IMPORTS_TORCH.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'distqa.tasks' has no attribute {name!r}; what a fork may import from it is "
                             "distqa.tasks.__all__ (docs/FORKING.md)")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once: the next lookup finds it here
    return value


def make_task(config: Config) -> Task:
    """The task of ``config`` (its ``task`` setting), built over it."""
    return task_class(config.task)(config)  # type: ignore[return-value]  # the registry checked it extends Task
