"""``project.toml``: what a project (the template, or a fork of it) sets for the template's files to read.

The Makefile, the Dockerfile and scripts/worker.sh ask for one setting at a time, before any environment exists, so
this file runs as a script with the standard library alone::

    python3 src/distqa/upkeep/project.py run.args          # make run's trainer flags
    python3 src/distqa/upkeep/project.py --split jobs.args # the deploy/ jobs' trainer flags, one per line
                                                           # (each ${NAME} the job's environment variable)
    python3 src/distqa/upkeep/project.py image.apt         # the image's extra Debian packages, one per line

A missing key, an unknown one or a value of the wrong type is one line naming the key, with exit status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

PROJECT = "project.toml"
SETTINGS: dict[str, type] = {"run.args": str, "jobs.args": str, "image.python": list, "image.apt": list}
"""Every setting, as TABLE.KEY, with its type (a list holds strings)."""


class ProjectError(ValueError):
    """What is wrong with project.toml, in one line."""


def read_project(path: Path) -> dict[str, str | list[str]]:
    """Every setting of the project file ``path``, checked."""
    if not path.is_file():
        raise ProjectError(f"{path}: missing; every checkout has one (the template writes it when a fork starts: "
                           f"copy the template's {PROJECT} and set your values).")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ProjectError(f"{path}: not valid TOML ({err}).") from err
    settings: dict[str, str | list[str]] = {}
    for table, values in raw.items():
        if not isinstance(values, dict):
            raise ProjectError(f"{path}: {table} is no table; the settings are {sorted(SETTINGS)}.")
        for key, value in values.items():
            name = f"{table}.{key}"
            kind = SETTINGS.get(name)
            if kind is None:
                raise ProjectError(f"{path}: unknown setting [{table}] {key}; the settings are {sorted(SETTINGS)}.")
            if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
                wanted = "a string" if kind is str else "a list of strings"
                raise ProjectError(f"{path}: [{table}] {key} must be {wanted}, got {value!r}.")
            settings[name] = value
    missing = sorted(set(SETTINGS) - set(settings))
    if missing:
        raise ProjectError(f"{path}: {missing[0]} is not set; give it (empty: \"\" or []), as the template's "
                           f"{PROJECT} does.")
    return settings


def expand(words: list[str], setting: str, environ: dict[str, str]) -> list[str]:
    """``words`` with each ``${NAME}`` replaced by the environment's NAME: a job's own paths (its
    DISTQA_OUTPUT_DIR: /project/results in a pod, a bucket on SkyPilot) in the project's flags."""
    def value(match: re.Match[str]) -> str:
        if match.group(1) not in environ:
            raise ProjectError(f"{PROJECT}: {setting} names ${{{match.group(1)}}}, which this environment does not "
                               "set; set it in the job, or write the value itself.")
        return environ[match.group(1)]

    return [re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value, word) for word in words]


def split_setting(path: Path, setting: str, environ: dict[str, str]) -> list[str]:
    """The string ``setting`` of the project file ``path`` split as a shell would, each ``${NAME}`` the environment's
    NAME (``--split``; ``python -m distqa.launch.node --project-args`` reads jobs.args so)."""
    value = read_project(path)[setting]
    if isinstance(value, list):
        return value
    try:
        words = shlex.split(value)
    except ValueError as err:  # shlex's unbalanced quotes
        raise ProjectError(f"{path}: {setting}: {err}") from err
    return expand(words, setting, environ)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="project.py", description="Print one setting of project.toml.")
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("--split", action="store_true", help="a string setting split as a shell would, a word a "
                        "line, each ${NAME} the environment's NAME")
    parser.add_argument("--file", type=Path, default=Path(__file__).resolve().parents[3] / PROJECT,
                        help=f"the project file (default: the checkout's {PROJECT})")
    args = parser.parse_args(argv)
    try:
        value = read_project(args.file)[args.setting]
        words = split_setting(args.file, args.setting, dict(os.environ)) if args.split or isinstance(value, list) \
            else [value]
    except ProjectError as err:
        print(err, file=sys.stderr)
        return 2
    if words:
        print("\n".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
