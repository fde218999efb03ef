"""Preset files: ``configs/NAME.toml`` (or any path to a ``.toml``), read and checked, and the tasks each is for.

A preset holds settings (raw TOML values, typed once the run's task is known, by :mod:`distqa.config.sources`) and
may say which tasks it is for, ``tasks = ["dummy", "mytask"]``; its ``task``, if it names one, must be
among them. A preset applies only to a run of one of its tasks: the default preset (``tiny-cpu``) is left
out of any other run, and a preset given explicitly for another task is refused in one line. A preset that
names no tasks (a fork's own file may not) is for any task. Every preset under ``configs/`` names its tasks.
No torch here: ``python -m distqa.config.sources --run-dir`` (before every node start) reads presets.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distqa.config.registry import REGISTERED
from distqa.config.schema import PRESETS_DIR, ConfigError


@dataclass
class Preset:
    """One preset: its name as given, its file (None for ``none``), its settings and the tasks it is for."""

    name: str
    path: Path | None = None
    values: dict[str, Any] = field(default_factory=dict)
    """The settings, raw; ``task`` is still among them."""
    tasks: list[str] = field(default_factory=list)
    """The tasks it is for, as written (registered names or ``package.module:ClassName``); empty: any task."""

    def is_for(self, task: str) -> bool:
        """Whether a run of ``task`` may use this preset (a registered name and its import path are one task)."""
        return not self.tasks or _import_path(task) in {_import_path(t) for t in self.tasks}

    def refusal(self, given: str, task: str) -> str:
        """The one line that refuses this preset, given by ``given`` (``--preset``, ``DISTQA_PRESET``), for ``task``."""
        return (f"{given} {self.name}: this preset is for task {' and '.join(self.tasks)}, not for this run's task "
                f"{task!r}; choose a preset for that task, or --preset none for the built-in defaults.")


def read_preset(name: str) -> Preset:
    """The preset ``name`` (``none``: no file, no settings) with its ``tasks`` taken out of its values; a one-line
    ConfigError naming the file for a missing file, invalid TOML, or a ``tasks`` key that is not a list of names."""
    if name == "none":
        return Preset(name)
    path = Path(name) if name.endswith(".toml") else PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
        raise ConfigError(f"preset {name!r}: {path} does not exist; choose one of {known}, "
                          "'none', or a path to a .toml file.")
    try:
        values = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"preset {path}: not valid TOML ({err}).") from err
    if "preset" in values:
        raise ConfigError(f"preset {path}: unknown key 'preset'; a preset cannot name another; remove it.")
    tasks = values.pop("tasks", [])
    if not (isinstance(tasks, list) and all(isinstance(t, str) and t for t in tasks)):
        raise ConfigError(f"preset {path}: tasks must be a list of task names, such as tasks = [\"mytask\"].")
    preset = Preset(name, path, values, tasks)
    own = values.get("task")
    if isinstance(own, str) and not preset.is_for(own):
        raise ConfigError(f"preset {path}: its task {own!r} is not one of its tasks {tasks}; add it there.")
    return preset


def _import_path(task: str) -> str:
    return REGISTERED.get(task, task)
