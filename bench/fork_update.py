"""A real fork, updated two ways: `git merge` of the template against `make update-template` (docs/FORKING.md).

The fork is made at an old template commit (default 316930c, before the upkeep existed) as that commit's
docs/FORKING.md said: the paths of its "may delete" rows deleted (the QA package, presets, samples, scripts,
benchmarks, pages, the notebook and each test file that imports distqa.qa), a task and preset of its own, its own
README, one line added to .neuro/live.yml. It is then brought to the template's TARGET (default HEAD)::

    python bench/fork_update.py                       # fork at 316930c, template at HEAD
    python bench/fork_update.py --base 316930c --target main

(a) `git merge TARGET`: the conflicts git leaves (counted, then the merge is aborted);
(b) the upkeep, as FORKING.md tells a fork made before fork.toml (its parts left out: qa and notebooks; the test
    files it deleted that are the machinery's come back, free of the QA package now): the first run stops on the
    edited .neuro/live.yml and says where the line goes; the line is taken back, the update runs (timed), and the
    line goes into .neuro/project.yml. Its conflicts: the paths git reports unmerged, and any conflict marker.
Needs this checkout's history (not a shallow clone). Prints the counts and the update's wall time.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "advice.detachedHead=false"]
LIVE_LINE = "    MYTASK_DATA: /data/mytask\n"
"""The fork's line in .neuro/live.yml's defaults env (a platform setting of its own)."""


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=check, timeout=300)


def may_delete(fork: Path) -> list[str]:
    """The paths of the "may delete" rows of the fork's docs/FORKING.md, and the test files that import distqa.qa."""
    guide = (fork / "docs" / "FORKING.md").read_text()
    named = [path for row in guide.splitlines() if row.startswith("|") and "| may delete |" in row
             for path in re.findall(r"`([^`]+)`", row.split("|")[1]) if (fork / path).exists()]
    tests = [str(p.relative_to(fork)) for p in (fork / "tests").glob("test_*.py") if "distqa.qa" in p.read_text()]
    return named + tests


def make_fork(fork: Path, base: str) -> None:
    git(REPO_ROOT, "worktree", "prune")
    subprocess.run([*GIT, "clone", "--quiet", "--no-checkout", str(REPO_ROOT), str(fork)], check=True, timeout=300)
    git(fork, "checkout", "--quiet", "-b", "fork", base)
    for path in may_delete(fork):
        git(fork, "rm", "-r", "--quiet", path)
    (fork / "src" / "mytask").mkdir(parents=True)
    (fork / "src" / "mytask" / "__init__.py").write_text("")
    shutil.copy(fork / "examples" / "text_classification" / "task.py", fork / "src" / "mytask" / "task.py")
    (fork / "configs").mkdir(exist_ok=True)
    (fork / "configs" / "mytask.toml").write_text('task = "mytask.task:TextClassification"\nmax_steps = 100\n')
    (fork / "README.md").write_text("# mytask\n\nOur own front page.\n")
    live = (fork / ".neuro" / "live.yml").read_text()
    (fork / ".neuro" / "live.yml").write_text(live.replace("    PYTHONUNBUFFERED: \"1\"\n",
                                                           "    PYTHONUNBUFFERED: \"1\"\n" + LIVE_LINE, 1))
    git(fork, "add", "--all")
    git(fork, "commit", "--quiet", "-m", "mytask: our task, preset, README and platform line")


def merge_conflicts(fork: Path, target: str) -> list[str]:
    git(fork, "merge", "--no-edit", "--quiet", target, check=False)
    unmerged = git(fork, "diff", "--name-only", "--diff-filter=U").stdout.split()
    git(fork, "merge", "--abort", check=False)
    return unmerged


def upkeep(fork: Path, base: str, target_commit: str) -> subprocess.CompletedProcess[str]:
    """The update by the target's own distqa.upkeep (FORKING.md's command for a fork without fork.toml)."""
    with tempfile.TemporaryDirectory() as tool:
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", target_commit,
                                  "src/distqa/__init__.py", "src/distqa/upkeep"], capture_output=True, check=True,
                                 timeout=60).stdout
        subprocess.run(["tar", "-x", "-C", tool], input=archive, check=True, timeout=60)
        return subprocess.run([sys.executable, "-m", "distqa.upkeep", "update", "--upstream", str(REPO_ROOT),
                               "--ref", target_commit, "--base", base, "--left-out", "qa notebooks"], cwd=fork,
                              capture_output=True, text=True,
                              env={"PYTHONPATH": str(Path(tool) / "src"), "PATH": "/usr/bin:/bin"}, timeout=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="316930c", help="the template commit the fork is made at")
    parser.add_argument("--target", default="HEAD", help="the template commit the fork is brought to")
    args = parser.parse_args()
    for ref in (args.base, args.target):
        if git(REPO_ROOT, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False).returncode:
            print(f"fork_update: {ref} is no commit of this checkout (a shallow clone? git fetch --unshallow)",
                  file=sys.stderr)
            return 2
    target = git(REPO_ROOT, "rev-parse", args.target).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        fork = Path(work) / "fork"
        make_fork(fork, args.base)
        merged = merge_conflicts(fork, target)
        print(f"(a) git merge {target[:12]} into a fork made at {args.base}: {len(merged)} conflicts")
        for path in merged:
            print(f"    {path}")
        first = upkeep(fork, args.base, target)
        print(f"(b) make update-template, first run: exit {first.returncode}")
        for line in first.stderr.splitlines():
            print(f"    {line}")
        git(fork, "checkout", args.base, "--", ".neuro/live.yml")
        git(fork, "commit", "--quiet", "-m", "the platform line goes to .neuro/project.yml")
        started = time.perf_counter()
        second = upkeep(fork, args.base, target)
        seconds = time.perf_counter() - started
        if second.returncode != 0:
            print(second.stderr, file=sys.stderr)
            return 1
        project = fork / ".neuro" / "project.yml"
        project.write_text(project.read_text() + "\ndefaults:\n  env:\n" + LIVE_LINE)
        git(fork, "commit", "--quiet", "--all", "-m", "our platform line, in the project's own file")
        unmerged = git(fork, "diff", "--name-only", "--diff-filter=U").stdout.split()
        markers = git(fork, "grep", "-l", "-E", "^(<<<<<<<|>>>>>>>) ", check=False).stdout.split()
        print(f"(b) make update-template, after the line moved: {len(unmerged) + len(markers)} conflicts, "
              f"{seconds:.2f} s")
        for line in second.stdout.splitlines():
            print(f"    {line}")
        status = git(fork, "status", "--porcelain").stdout
        print(f"    working tree after: {status or 'clean'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
