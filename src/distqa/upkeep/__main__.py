"""The upkeep's commands (the Makefile's targets call them with any Python >= 3.11, before any environment exists)::

    make new-fork NAME=mytask DIR=../mytask WITHOUT="qa slurm"   # python3 -m distqa.upkeep new-fork ...
    make update-template UPSTREAM=https://github.com/ORG/distqa.git REF=v2.0   # ... update
    python3 -m distqa.upkeep table                                # docs/FORKING.md's table of the parts

``update`` fetches REF and runs REF's own copy of this package on the fork, so the newer template's rules
(``template.toml``) decide. Every refusal is one line per reason on stderr, exit status 2, with nothing changed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from distqa.upkeep import git
from distqa.upkeep.git import UpkeepError
from distqa.upkeep.new_fork import new_fork
from distqa.upkeep.ownership import DECLARATION, Declaration, DeclarationError
from distqa.upkeep.record import ForkRecord
from distqa.upkeep.update import refuse_dirty, update

HANDED_OVER = "DISTQA_UPKEEP_COMMIT"
"""Set when REF's copy of the upkeep runs: the commit it was taken from (no second hand-over)."""
PACKAGE = ("src/distqa/__init__.py", "src/distqa/upkeep")
"""What REF's copy of the upkeep runs from. A fork's own (older) copy extracts these paths, so the upkeep stays within
them, standard library alone: a newer upkeep that imported anything else would not run for an older fork."""


def parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(prog="python -m distqa.upkeep", description=__doc__.split("\n\n")[0])
    sub = commands.add_subparsers(dest="command", required=True)
    fork = sub.add_parser("new-fork", help="start a fork of this checkout's commit")
    fork.add_argument("--name", required=True, help="the fork's task package (lowercase), e.g. mytask")
    fork.add_argument("--dir", required=True, type=Path, help="the new repository's folder (new or empty)")
    fork.add_argument("--without", default="", help="parts to leave out, space- or comma-separated (template.toml)")
    fork.add_argument("--upstream", help="the template's URL or path recorded in fork.toml (default: origin's)")
    up = sub.add_parser("update", help="take the template's changes from the recorded commit to REF")
    up.add_argument("--upstream", help="the template's URL or path (default: fork.toml's)")
    up.add_argument("--ref", default="main", help="a tag, branch or commit of the template (default: main)")
    up.add_argument("--base", help="without fork.toml: the template commit the fork was made from")
    up.add_argument("--left-out", help="without fork.toml: the parts it left out ('none': none)")
    up.add_argument("--no-commit", action="store_true", help="leave the changes staged for review, uncommitted")
    sub.add_parser("table", help="print docs/FORKING.md's table of the parts")
    # `--help` shows every command's options, so that one help text says all the upkeep accepts.
    commands.epilog = "".join(command.format_usage() for command in (fork, up))
    commands.formatter_class = argparse.RawDescriptionHelpFormatter
    return commands


def split(names: str | None) -> list[str] | None:
    return None if names is None else [n for n in names.replace(",", " ").split() if n]


def hand_over(root: Path, args: argparse.Namespace, argv: list[str]) -> int:
    """Fetch REF and run its copy of this package with the same arguments (the newer rules decide)."""
    record = ForkRecord.read(root)
    upstream = args.upstream or (record.upstream if record else None)
    if not upstream:
        raise UpkeepError("no fork.toml here and no UPSTREAM: name the template's repository (UPSTREAM=URL-or-path).")
    refuse_dirty(root)
    git.fetch(root, upstream)
    target = git.resolve(root, args.ref, upstream)
    with tempfile.TemporaryDirectory(prefix="distqa-upkeep-") as newer:
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", target, *PACKAGE],
                                 capture_output=True)
        if archive.returncode != 0:
            raise UpkeepError(f"REF {args.ref!r} ({target[:12]}) has no distqa/upkeep: it predates the upkeep; "
                              "name a later one.")
        subprocess.run(["tar", "-x", "-C", newer], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": str(Path(newer) / "src"), HANDED_OVER: target}
        return subprocess.run([sys.executable, "-m", "distqa.upkeep", *argv, "--upstream", upstream], cwd=root,
                              env=env).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    here = Path.cwd()
    try:
        if args.command == "table":
            print(Declaration.parse((here / DECLARATION).read_text()).table())
        elif args.command == "new-fork":
            print(new_fork(here, args.name, args.dir, split(args.without) or [], args.upstream))
        elif not os.environ.get(HANDED_OVER):
            return hand_over(here, args, argv)
        else:
            print(update(here, args.upstream, args.ref, os.environ[HANDED_OVER], args.base, split(args.left_out),
                         commit=not args.no_commit))
    except (UpkeepError, DeclarationError) as err:
        for line in str(err).splitlines():
            print(f"{args.command}: {line}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
