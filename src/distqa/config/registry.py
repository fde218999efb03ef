"""The tasks a run can train, by name, and the import of a fork's own (``--task package.module:ClassName``).

The interface is :mod:`distqa.tasks.base`, which sits above this package (it imports torch and the settings' schema);
here the registry is strings: import paths, and only the task a run uses is imported (:func:`task_class`). Other
registered tasks are imported only where their settings must be named (a flag or key that is not the run's,
``.env.example``), and one whose module is gone (a fork that deleted ``distqa/qa``) is left out there
(:func:`available_tasks`). ``python -m distqa.prepare`` resolves settings through it, and its featurising processes
re-import what it imports. :mod:`distqa.tasks` re-exports it, with :func:`~distqa.tasks.make_task`.
"""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol

from distqa.config.schema import Config, ConfigError, Section, fields_of

TASK_BASE = "distqa.tasks.base.Task"
"""The class every task extends, named, not imported: it sits above this package."""


class TaskClass(Protocol):
    """What the settings read of a task's class (a subclass of :data:`TASK_BASE`): its name, settings class, the
    sections ``prepare`` shows, and its commands."""

    name: ClassVar[str]
    config_class: ClassVar[type[Config]]
    prepare_sections: ClassVar[Sequence[Section]]
    commands: ClassVar[Mapping[str, str]]


# The registry entry of the built-in tasks: the only place outside distqa/qa that names them
# (tests/unit/test_task_neutral.py); a fork that deleted distqa/qa keeps it as it is (available_tasks).
REGISTERED = {
    "dummy": "distqa.qa.dummy:DummyTask",
    "nq": "distqa.qa.nq.task:NQTask",
    "squad": "distqa.qa.squad.task:SquadTask",
}
"""Registered tasks: name -> ``package.module:ClassName``. A fork needs no entry here: ``--task`` takes the path."""
LIGHT_COMMANDS = {
    "dummy": {"score": "distqa.qa.nq.commands:score"},
    "nq": {"score": "distqa.qa.nq.commands:score"},
    "squad": {"score": "distqa.qa.squad.commands:score"},
}
"""Registered task -> the commands it declares that run without importing its module (which imports torch and
transformers; the scorers import neither): ``python -m distqa.score`` starts in 0.4 s of CPU, not 4. A test checks
that they are what the task classes declare (tests/qa/test_commands_qa.py)."""


def task_class(spec: str) -> type[TaskClass]:
    """The Task class that ``spec`` names: a registered name or ``package.module:ClassName``; a one-line
    ConfigError saying what failed otherwise (an unknown name lists the registered ones)."""
    path = REGISTERED.get(spec, spec)
    module_name, colon, class_name = path.partition(":")
    if not colon or not module_name or not class_name.isidentifier():
        raise ConfigError(f"task {spec!r} is not a registered task ({', '.join(REGISTERED)}); a fork's own task "
                          "is given as package.module:ClassName (docs/FORKING.md).")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            raise ConfigError(f"task {spec!r}: no module named {err.name!r} on the Python path; run from the "
                              "repository (scripts/worker.sh adds it to PYTHONPATH) or install the package that "
                              "holds it.") from None
        raise ConfigError(f"task {spec!r}: importing {module_name} failed: {_where(err, module_name)}") from None
    except Exception as err:  # a fork's module can fail in any way while it is imported; say where, in one line
        raise ConfigError(f"task {spec!r}: importing {module_name} failed: {_where(err, module_name)}") from None
    found = getattr(module, class_name, None)
    # By name: the interface imports torch, which this registry must not (see the docstring).
    if not (isinstance(found, type) and any(f"{c.__module__}.{c.__qualname__}" == TASK_BASE for c in found.__mro__)):
        kind = "class" if isinstance(found, type) else type(found).__name__
        what = "is not defined" if found is None else f"is a {kind}, not a subclass of Task"
        raise ConfigError(f"task {spec!r}: {class_name} in {module_name} {what}; a task is a subclass of "
                          f"{TASK_BASE} (docs/FORKING.md).")
    if not (isinstance(found.config_class, type) and issubclass(found.config_class, Config)):
        raise ConfigError(f"task {spec!r}: {class_name}.config_class must be a dataclass that extends "
                          f"distqa.config.Config, got {found.config_class!r}.")
    return found


def available_tasks() -> list[str]:
    """The registered tasks whose module is on the Python path, found without importing it (a fork may delete
    ``distqa/qa`` and keep this registry as it is)."""
    return [name for name, path in REGISTERED.items() if _module_exists(path.partition(":")[0])]


def other_tasks_settings(config_class: type[Config]) -> dict[str, set[str]]:
    """Available registered task -> the settings it has and ``config_class`` lacks (a ``.env`` or a preset may
    hold them; a flag of them is refused naming the task). Imports every available task: call it only where a
    setting is not ``config_class``'s."""
    mine = set(fields_of(config_class))
    return {name: extra for name in available_tasks()
            if (extra := set(fields_of(task_class(name).config_class)) - mine)}


def _module_exists(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a package above it is missing
        return False


def _where(err: BaseException, module_name: str) -> str:
    """``Type: message (file:line)`` on one line; the line is the deepest one in the package of ``module_name``
    (the fork's own code), else where it was raised."""
    if isinstance(err, SyntaxError) and err.filename:
        place = f"{err.filename}:{err.lineno}"
    else:
        frames = traceback.extract_tb(err.__traceback__)
        spec = importlib.util.find_spec(module_name.split(".")[0])
        roots = [str(Path(p)) for p in (spec.submodule_search_locations or [])] if spec else []
        own = [f for f in frames if any(f.filename.startswith(root) for root in roots)] or frames
        place = f"{own[-1].filename}:{own[-1].lineno}" if own else ""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {message}" + (f" ({place})" if place else "")
