"""Every command line the documentation writes for the platform CLIs, checked against the click
command trees of the installed CLI (no platform needed). Torch-free, so the apolo-flow 26
environment can run it too: `python tests/standin/cli_commands.py` prints what is wrong."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import click

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_NAMES = ("neuro-flow", "apolo-flow", "apolo", "neuro")
DOCUMENTS = ["README.md", ".neuro/README.md", ".neuro/live.yml", ".neuro/project.yml",
             *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "scripts").iterdir()),
             *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").rglob("*") if p.is_file())]


def click_trees() -> dict[str, click.Group]:
    """The command groups behind the installed console scripts (see .venv/bin/neuro-flow, apolo)."""
    from apolo_cli.main import cli as apolo_cli
    from apolo_flow.cli.main import cli as flow_cli

    return {"neuro-flow": flow_cli, "apolo-flow": flow_cli, "apolo": apolo_cli, "neuro": apolo_cli}


def documented_command_lines() -> list[tuple[str, str]]:
    """(file, command line) for every line or code span of the documents that starts with a CLI name
    followed by a subcommand word; comment markers are dropped and `;`, `&&`, `|` split commands."""
    found = []
    for name in DOCUMENTS:
        text = (REPO_ROOT / name).read_text()
        if not name.endswith(".md"):  # comments of scripts and YAML: drop the markers, keep the text
            text = "\n".join(re.sub(r"^\s*#+ ?", "", line) for line in text.splitlines())
        pieces = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", text)]
        pieces += [line for line in text.splitlines()]
        for piece in pieces:
            for segment in re.split(r";|&&|\|\||\||`|: ", piece):
                segment = re.sub(r"\s#.*", "", segment).strip().removeprefix("$ ").rstrip(".,")
                first, _, rest = segment.partition(" ")
                if first in CLI_NAMES and re.match(r"[a-z][a-z-]*( |$)", rest):
                    found.append((name, segment))
    return found


def check_command_line(line: str, trees: dict[str, click.Group], live: Any) -> str | None:
    """None if LINE names a command of the installed CLI with options it has, else what is wrong."""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    command: click.Command = trees[words[0]]
    path = [words[0]]
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        if sub is None:
            return f"'{' '.join(path)} {rest[0]}' is not a command (it has: {', '.join(sorted(command.commands))})"
        command, path, rest = sub, [*path, rest[0]], rest[1:]
    if isinstance(command, click.Group):
        return f"'{' '.join(path)}' is a group: name one of its commands"
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    positional = []
    words_left = iter(rest)
    for word in words_left:
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1:
            option = word.split("=", 1)[0]
            if option not in options and option not in ("-h", "--help"):
                return f"'{' '.join(path)}' has no option {option} (it has: {', '.join(sorted(options))})"
            param = next((p for p in command.params if option in (*p.opts, *p.secondary_opts)), None)
            if param is not None and not getattr(param, "is_flag", False) and "=" not in word:
                for _ in range(param.nargs if param.nargs > 0 else 1):
                    next(words_left, None)
        else:
            positional.append(word)
    placeholder = positional and (positional[0].startswith("<") or (re.fullmatch(r"[A-Z_]+", positional[0])
                                  and positional[0] != "ALL"))
    if path[0].endswith("-flow") and positional and not placeholder:
        known = {"run": live.jobs, "status": live.jobs, "logs": live.jobs, "kill": live.jobs,
                 "upload": live.volumes, "download": live.volumes, "build": live.images}.get(path[1])
        if known is not None and positional[0] not in {*known, "ALL"}:
            return f"'{' '.join(path)}' names {positional[0]!r}, which .neuro/live.yml does not define"
    return None


def problems() -> list[str]:
    """What is wrong with the documented command lines under the installed CLI (empty: nothing)."""
    from apolo_flow.parser import parse_live

    live = parse_live(REPO_ROOT, REPO_ROOT / ".neuro" / "live.yml")
    trees = click_trees()
    return [f"{name}: {line}\n    {problem}" for name, line in documented_command_lines()
            if (problem := check_command_line(line, trees, live))]


if __name__ == "__main__":
    found = problems()
    print(json.dumps({"lines": len(documented_command_lines()), "problems": found}))
    sys.exit(1 if found else 0)
