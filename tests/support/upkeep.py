"""What tests/unit/test_upkeep.py and tests/distributed/test_upkeep.py share: a template repository made from this
checkout, a fork of it made with `make new-fork`, the template's later commits and the fork updated across them.
Its fixture ``upstream_and_fork`` is imported by name (``upstream_and_fork_fixture``) into each file that takes it:
made once per module that uses it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import clean_env
from support.repo import REPO_ROOT

IS_FORK = (REPO_ROOT / "fork.toml").is_file()
template_only = pytest.mark.skipif(IS_FORK, reason="the template's own checks; this checkout is a fork (fork.toml)")
NAME = "mytask"
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]


def checkout_files() -> list[str]:
    """What a commit of this checkout would hold: tracked files, and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True, timeout=60).stdout.decode()
    return sorted(p for p in set(listed.split("\0")) if p and (REPO_ROOT / p).is_file())


# --- end to end: a fork made at A takes the template's B ---------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def make(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``make ARGS`` in ``repo``, as a user types it (the upkeep's targets need no environment)."""
    return subprocess.run(["make", "--no-print-directory", *args], cwd=repo, env=clean_env(), capture_output=True,
                          text=True, timeout=120)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} has no {old!r}"
    path.write_text(text.replace(old, new, 1))


def template_moves_on(template: Path) -> None:
    """Commits of the template after the fork was made: the machinery, the QA package, a page, the README,
    .neuro/live.yml, the Dockerfile and the Makefile change; a QA preset, a QA test and a machinery test arrive."""
    edit(template / "src/distqa/distributed/stop.py", '"""', '# Changed upstream after the fork.\n"""')
    edit(template / "src/distqa/qa/model.py", '"""', '# Changed upstream after the fork.\n"""')
    edit(template / "docs/CONFIGURATION.md", "\n", "\n\nChanged upstream after the fork.\n")
    edit(template / "README.md", "\n", "\n\nChanged upstream after the fork.\n")
    edit(template / "CHANGELOG.md", "\n## ",
         "\n## upstream\n\n- [edit] `distqa.upstream` moved: write `from x import y`.\n\n## ")
    git(template, "commit", "--quiet", "--all", "-m", "machinery, QA, docs and README")
    edit(template / ".neuro/live.yml", "kind: live\n", "kind: live\n# Changed upstream after the fork.\n")
    edit(template / "Dockerfile", "FROM ${BASE_IMAGE}\n", "FROM ${BASE_IMAGE}\n# Changed upstream after the fork.\n")
    edit(template / "Makefile", ".DEFAULT_GOAL := help\n", ".DEFAULT_GOAL := help\n# Changed upstream.\n")
    edit(template / "project.toml", "\n", "\n# Changed upstream after the fork (a fork's own stays).\n")
    (template / "configs" / "upstream-qa.toml").write_text('tasks = ["squad"]\nlr = 1e-4\n')
    (template / "tests" / "qa").mkdir(exist_ok=True)
    (template / "tests" / "qa" / "test_upstream_qa.py").write_text(
        "from distqa.qa.model import QAModel\n\n\ndef test_upstream_qa() -> None:\n    assert QAModel\n")
    (template / "tests" / "test_upstream_machinery.py").write_text(
        "from distqa.distributed.stop import StopSignal\n\n\n"
        "def test_upstream_machinery() -> None:\n    assert StopSignal\n")
    git(template, "add", "--all")
    git(template, "commit", "--quiet", "-m", "platform, image and targets; a QA preset, a QA test, a machinery test")


def fork_customises(fork: Path) -> None:
    """What a fork sets, each in its own files: its README, an image dependency, its platform names, its job flags."""
    (fork / "README.md").write_text("# mytask\n\nOur own front page.\n")
    edit(fork / "project.toml", "python = []", 'python = ["six==1.16.0"]')
    edit(fork / "project.toml", 'args = "--preset mytask"\n\n[image]', 'args = "--preset mytask --max-steps 500"\n\n'
         "[image]")
    edit(fork / ".neuro/project.yml", "id: mytask", "id: mytask-platform")
    git(fork, "commit", "--quiet", "--all", "-m", "our own settings")


@pytest.fixture(scope="module", name="upstream_and_fork")
def upstream_and_fork_fixture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, str]:
    """The template at A (this checkout's files), a fork of A, the template at B, and the fork updated to B: the two
    repositories, the fork's commit before the update and the update's output."""
    work = tmp_path_factory.mktemp("upkeep")
    template, fork = work / "template", work / "fork"
    for name in checkout_files():
        (template / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, template / name)
    subprocess.run([*GIT, "init", "--quiet", "--initial-branch", "main", str(template)], check=True, timeout=60)
    git(template, "add", "--all")
    git(template, "commit", "--quiet", "-m", "A")
    made = make(template, "new-fork", f"NAME={NAME}", f"DIR={fork}", "WITHOUT=qa slurm")
    assert made.returncode == 0, made.stderr
    fork_customises(fork)
    before = git(fork, "rev-parse", "HEAD").strip()
    template_moves_on(template)
    updated = make(fork, "update-template", f"UPSTREAM={template}", "REF=main")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    return template, fork, before, updated.stdout


def in_fork(fork: Path, *command: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """A command of this environment's Python in the fork, its own package first on the path (nothing installed)."""
    return subprocess.run([sys.executable, *command], cwd=fork, env=clean_env(PYTHON=sys.executable,
                          PYTHONPATH=str(fork / "src")), capture_output=True, text=True, timeout=timeout)
