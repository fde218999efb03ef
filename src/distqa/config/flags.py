"""The command line of each entry point: one ``--field-name`` flag per setting of the sections it uses.

``python -m distqa.train`` and the doctor take every section of the task's settings (:func:`train_sections`),
``python -m distqa.prepare`` what builds the task's cache (:func:`prepare_sections`), ``predict`` and
``evaluate`` a few settings each (:func:`add_setting_flags`); a flag means the same thing everywhere. Values
are typed by :mod:`distqa.config.values`; where they come from is :mod:`distqa.config.sources`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from distqa.config.registry import TaskClass, available_tasks, other_tasks_settings, task_class
from distqa.config.schema import ENV_PREFIX, PRESET, SECTIONS, TASK, Config, ConfigError, Section, fields_of
from distqa.config.values import coerce, metavar

SectionsOf = Callable[[type[TaskClass]], Sequence[Section]]
"""Which sections of a task's settings an entry point shows."""

RENAMED = {"dataset": "task"}
"""Settings an earlier release renamed: a flag, variable or preset key of the old name is refused naming the new."""


def train_sections(task: type[TaskClass]) -> list[Section]:
    """``python -m distqa.train`` (and the doctor): every section of the task's settings (:func:`ordered_sections`)."""
    return ordered_sections(f.metadata["section"] for f in fields_of(task.config_class).values())


def ordered_sections(used: Iterable[Section]) -> list[Section]:
    """The sections of ``used`` (in field order, repeats allowed) in the order ``--help`` and .env.example show
    them: the machinery's (:data:`~distqa.config.SECTIONS`) first in their fixed order, then a task's own in the
    order their first field comes."""
    used = list(used)
    return [s for s in SECTIONS if s in used] + list(dict.fromkeys(s for s in used if s not in SECTIONS))


def prepare_sections(task: type[TaskClass]) -> list[Section]:
    """``python -m distqa.prepare``: the preset, the task, and what determines the task's cache."""
    return [PRESET, TASK, *[s for s in task.prepare_sections if s not in (PRESET, TASK)]]


def section_fields(sections: Iterable[Section], config_class: type[Config]) -> list[str]:
    """The names of the settings of ``config_class`` in ``sections``, in field order."""
    wanted = set(sections)
    return [name for name, f in fields_of(config_class).items() if f.metadata["section"] in wanted]


def build_arg_parser(prog: str = "python -m distqa.train", task: type[TaskClass] | None = None,
                     sections: SectionsOf = train_sections, description: str = "") -> argparse.ArgumentParser:
    """The command line of an entry point for ``task`` (default: the built-in default task): one
    ``--field-name`` flag per setting of ``sections``, grouped by section, with the help of the field docs."""
    task = task or task_class(fields_of(Config)["task"].default)
    config_class = task.config_class
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(description + " " if description else "") + "Precedence of settings: defaults < --preset "
        f"file < .env / DISTQA_* environment variables < these flags. The settings shown are those of task "
        f"{task.name or config_class.__name__!r}; --task NAME --help shows another's (registered: "
        f"{', '.join(available_tasks()) or 'none here'}; a fork's: --task package.module:ClassName).",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    for section in sections(task):
        group = parser.add_argument_group(section.title)
        add_setting_flags(group, section_fields((section,), config_class), config_class)
    return parser


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str], config_class: type[Config],
                task: str) -> dict[str, Any]:
    """The flags of ``argv`` by setting name (raw strings). A flag of another registered task's settings is
    refused naming that task; any other unknown argument as argparse does (usage, exit 2)."""
    flags, unknown = parser.parse_known_args(argv)
    for argument in unknown:
        name = argument.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if argument.startswith("--") and name in RENAMED:
            raise ConfigError(f"--{name} was renamed --{RENAMED[name]} (CHANGELOG.md): write --{RENAMED[name]} "
                              "with the same value.")
        owners = [owner for owner, fields in other_tasks_settings(config_class).items() if name in fields]
        if argument.startswith("--") and owners:
            raise ConfigError(f"--{name.replace('_', '-')} is a setting of task {' and '.join(map(repr, owners))}, "
                              f"not of task {task!r}: add --task {owners[0]}, or leave the flag out.")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return vars(flags)


def add_setting_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, names: Iterable[str],
                      config_class: type[Config], aliases: Mapping[str, str] | None = None,
                      show_defaults: bool = True) -> None:
    """``--field-name`` flags for the settings ``names`` of ``config_class`` (raw strings: :func:`coerce_flag`
    types them); ``aliases`` adds another flag for a setting (name -> flag). ``show_defaults`` False leaves
    the built-in defaults out of the help, where they are not what applies (predict: the checkpoint's)."""
    fields = fields_of(config_class)
    for name in names:
        f = fields[name]
        flags = ["--" + name.replace("_", "-"), *([aliases[name]] if aliases and name in aliases else [])]
        parser.add_argument(*flags, dest=name, metavar=metavar(name, config_class), default=argparse.SUPPRESS,
                            help=f"{f.metadata['help']}" + (f" (default: {f.default})" if show_defaults else ""))


def coerce_flag(name: str, raw: Any, config_class: type[Config]) -> Any:
    """The typed value of the flag of setting ``name``; ConfigError naming the flag otherwise."""
    return coerce(name, raw, f"flag --{name.replace('_', '-')}", config_class)


def setting_overrides(flags: argparse.Namespace, names: Iterable[str], config_class: type[Config],
                      environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings ``names`` an entry point takes over a checkpoint's (``predict``, ``evaluate``): from their
    ``DISTQA_*`` variables (a platform job passes them so), then from the flags, which win; typed."""
    values = {name: coerce(name, environ[key], f"environment variable {key}", config_class)
              for name in names if (key := ENV_PREFIX + name.upper()) in environ}
    given = vars(flags)
    return values | {name: coerce_flag(name, given[name], config_class) for name in names if name in given}


def refuse_other_tasks_flags(flags: argparse.Namespace, names: Iterable[str], own: Collection[str], why: str) -> None:
    """A ConfigError for a flag among ``names`` that is not among ``own``: an entry point whose flags serve several
    tasks (predict, evaluate: by the checkpoint's) was given another task's. ``why`` ends the sentence."""
    given = [name for name in names if name in vars(flags) and name not in own]
    if given:
        raise ConfigError(f"--{given[0].replace('_', '-')} is a setting of another task; {why}. Leave the flag out.")
