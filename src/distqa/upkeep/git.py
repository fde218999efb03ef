"""The few git operations the upkeep needs, through git's own command line (plumbing where it exists).

A template commit is read as a tree of blobs (``git ls-tree``, ``git cat-file``): nothing is merged, so a fork needs
no history shared with the template (a copy made with a host's "use this template" works as a clone does).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

TEMPLATE_REFS = "refs/template"
"""Where the template's branches and tags are fetched into a fork (``refs/template/heads/main``), apart from its own."""


class UpkeepError(RuntimeError):
    """A reason to stop, in one line; nothing has been changed when it is raised."""


@dataclass(frozen=True)
class Entry:
    """One file of a commit: its mode (``100644``, ``100755``, ``120000``) and blob."""

    mode: str
    blob: str


def git(repo: Path, *args: str, input: bytes | None = None) -> bytes:
    """``git args`` in ``repo``; a failure is an UpkeepError with git's last line."""
    result = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    if result.returncode != 0:
        said = [line for line in result.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise UpkeepError(f"git {' '.join(args[:2])}: {said[-1] if said else f'exit status {result.returncode}'}")
    return result.stdout


def text(repo: Path, *args: str) -> str:
    return git(repo, *args).decode().strip()


def tree(repo: Path, commit: str) -> dict[str, Entry]:
    """Every file of ``commit``: path -> Entry (submodules left out)."""
    listed = git(repo, "ls-tree", "-r", "-z", "--full-tree", commit)
    entries = {}
    for record in filter(None, listed.split(b"\0")):
        meta, path = record.split(b"\t", 1)
        mode, kind, blob = meta.decode().split()
        if kind == "blob":
            entries[path.decode()] = Entry(mode, blob)
    return entries


def blob(repo: Path, sha: str) -> bytes:
    return git(repo, "cat-file", "blob", sha)


def read(repo: Path, commit: str, path: str) -> bytes | None:
    """``path`` as ``commit`` has it, or None where it has no such file."""
    listed = git(repo, "ls-tree", "-z", "--full-tree", commit, "--", path).rstrip(b"\0")
    return blob(repo, listed.split(b"\t", 1)[0].decode().split()[2]) if listed else None


def working_files(repo: Path) -> dict[str, Entry]:
    """The fork's files as they are on disk (tracked ones, and untracked ones git does not ignore): path -> Entry of
    the blob each would be, so that a file is compared with a template commit's by its hash alone."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    paths = [p for p in dict.fromkeys(listed.decode().split("\0")) if p and (repo / p).is_file()]
    plain = [p for p in paths if not (repo / p).is_symlink()]
    hashes = git(repo, "hash-object", "--stdin-paths", input="\n".join(plain).encode()).decode().split()
    entries = {p: Entry(_mode(repo / p), h) for p, h in zip(plain, hashes, strict=True)}
    for path in set(paths) - set(plain):
        target = os.readlink(repo / path).encode()
        entries[path] = Entry("120000", git(repo, "hash-object", "--stdin", input=target).decode().strip())
    return entries


def _mode(path: Path) -> str:
    return "100755" if os.access(path, os.X_OK) else "100644"


def dirty(repo: Path) -> list[str]:
    """The paths with changes git would commit or that it does not know yet (ignored ones aside)."""
    return [line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=all").decode().splitlines()]


def fetch(repo: Path, upstream: str) -> None:
    """Every branch and tag of ``upstream`` (a URL or a path) into refs/template/, apart from the fork's own refs."""
    git(repo, "fetch", "--quiet", "--no-tags", "--force", upstream,
        f"+refs/heads/*:{TEMPLATE_REFS}/heads/*", f"+refs/tags/*:{TEMPLATE_REFS}/tags/*")


def resolve(repo: Path, ref: str, upstream: str) -> str:
    """The commit ``ref`` names among what was fetched from ``upstream``: a tag, a branch, or a commit (in full or
    abbreviated) that one of them reaches."""
    for candidate in (f"{TEMPLATE_REFS}/tags/{ref}", f"{TEMPLATE_REFS}/heads/{ref}", ref):
        found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}"],
                               capture_output=True, text=True)
        if found.returncode == 0 and reached(repo, found.stdout.strip()):
            return found.stdout.strip()
    raise UpkeepError(f"REF {ref!r} is neither a branch, a tag nor a commit of {upstream}; "
                      f"name one that is (git ls-remote {upstream} lists them).")


def reached(repo: Path, commit: str) -> bool:
    """Whether a fetched template branch or tag reaches ``commit`` (so it is the template's, not only the fork's)."""
    found = subprocess.run(["git", "-C", str(repo), "for-each-ref", "--count=1", "--contains", commit,
                            TEMPLATE_REFS], capture_output=True, text=True)
    return found.returncode == 0 and bool(found.stdout.strip())


def commit_all(repo: Path, message: str) -> str:
    """Stage every change and commit it (the author is git's configured one, else the upkeep's own name)."""
    git(repo, "add", "--all")
    identity = []
    for key, fallback in (("user.name", "distqa upkeep"), ("user.email", "upkeep@distqa.invalid")):
        if subprocess.run(["git", "-C", str(repo), "config", key], capture_output=True).returncode != 0:
            identity += ["-c", f"{key}={fallback}"]
    git(repo, *identity, "commit", "--quiet", "--no-verify", "-m", message)
    return text(repo, "rev-parse", "HEAD")
