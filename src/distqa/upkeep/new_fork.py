"""``make new-fork NAME=mytask DIR=../mytask [WITHOUT="qa slurm"]``: a new repository that follows this template.

It holds the template's files at this checkout's commit (less the parts left out), the fork-owned files written for
the fork (its README, ``project.toml``, the platform's ``.neuro/project.yml``), a stub task written from the example
(``src/NAME/task.py``, its data, its preset ``configs/NAME.toml``, its test ``tests/test_NAME.py``) and ``fork.toml``,
the record ``make update-template`` reads. ``make run`` there trains the stub on 2 emulated nodes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from distqa.upkeep import git
from distqa.upkeep.git import UpkeepError
from distqa.upkeep.ownership import DECLARATION, Declaration
from distqa.upkeep.project import PROJECT
from distqa.upkeep.record import ForkRecord

EXAMPLE = "examples/text_classification"
RESERVED = {"distqa", "examples", "tests", "bench", "scripts", "configs", "data", "docs", "src"}


def replaced(text: str, old: str, new: str, where: str) -> str:
    """``text`` with every ``old`` made ``new``; an UpkeepError when there is none (the example moved on and this
    stub would silently keep the example's value)."""
    if old not in text:
        raise UpkeepError(f"new-fork: {where} no longer holds {old!r}; update distqa/upkeep/new_fork.py with it.")
    return text.replace(old, new)


def set_string(text: str, table: str, key: str, value: str) -> str:
    """The TOML ``text`` with ``key``'s string value in ``[table]`` set to ``value`` (comments kept)."""
    pattern = re.compile(rf"(^\[{re.escape(table)}\]\n(?:(?!^\[).*\n)*?^{re.escape(key)} = )\"[^\"\n]*\"", re.M)
    if not pattern.search(text):
        raise UpkeepError(f"new-fork: {PROJECT} has no [{table}] {key} = \"...\" line to set.")
    return pattern.sub(lambda match: match.group(1) + '"' + value.replace('"', '\\"') + '"', text, count=1)


def required(template: Path, commit: str, path: str) -> str:
    """``path`` as the template's ``commit`` has it; an UpkeepError where it has no such file."""
    content = git.read(template, commit, path)
    if content is None:
        raise UpkeepError(f"new-fork: {path} is missing at {commit[:12]}.")
    return content.decode()


def stub_files(template: Path, commit: str, name: str) -> dict[str, bytes]:
    """The fork's own starting files: the example's task, data and preset under the fork's name, and its test."""
    task = required(template, commit, f"{EXAMPLE}/task.py")
    for old, new in ((f"{EXAMPLE}/preset.toml", f"configs/{name}.toml"),
                     ("examples.text_classification.task", f"{name}.task"),
                     (f"{EXAMPLE}/reviews.tsv", f"data/{name}/reviews.tsv"),
                     (f"({EXAMPLE})", f"({name})"),
                     ("write it with `python -m examples.text_classification.make_data`", f"put {name}'s data there"),
                     ('name = "text_classification"', f'name = "{name}"')):
        task = replaced(task, old, new, f"{EXAMPLE}/task.py")
    task = replaced(task, '"""A fork\'s own task, whole:', f'"""{name}\'s task (written by `make new-fork` from the '
                    "template's example; make it\nyours: docs/FORKING.md), whole:", f"{EXAMPLE}/task.py")
    preset = required(template, commit, f"{EXAMPLE}/preset.toml")
    preset = replaced(preset, "examples.text_classification.task", f"{name}.task", f"{EXAMPLE}/preset.toml")
    preset = replaced(preset, f"{EXAMPLE}/preset.toml", f"configs/{name}.toml", f"{EXAMPLE}/preset.toml")
    preset = replaced(preset, 'run_name = "text-classification"', f'run_name = "{name}"', f"{EXAMPLE}/preset.toml")
    test = f'''"""{name}'s own tests, written by `make new-fork`: its task trains on 2 emulated nodes, loses node 1
mid-run and resumes to the weights of an uninterrupted run (the template's fork check, tests/support/fork_checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.fork_checks import lose_a_node_then_resume
from support.repo import REPO_ROOT

PRESET = REPO_ROOT / "configs" / "{name}.toml"


@pytest.mark.distributed
def test_{name}_resumes_after_a_lost_node_to_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    lose_a_node_then_resume(tmp_path, PRESET)
'''
    return {f"src/{name}/__init__.py": b"", f"src/{name}/task.py": task.encode(),
            f"data/{name}/reviews.tsv": git.read(template, commit, f"{EXAMPLE}/reviews.tsv") or b"",
            f"configs/{name}.toml": preset.encode(), f"tests/test_{name}.py": test.encode()}


def fork_owned_files(template: Path, commit: str, declaration: Declaration, name: str,
                     kept: set[str]) -> dict[str, bytes]:
    """The fork-owned files of the kept parts, written for the fork."""
    text = set_string(required(template, commit, PROJECT), "run", "args", f"--preset {name}")
    text = set_string(text, "jobs", "args", f"--preset {name}")
    readme = f"""# {name}

{name} trains its own model with the distqa template: multi-node PyTorch DDP with exact resume, fault
tolerance, a preflight doctor and launchers for emulated nodes, the Apolo platform, Slurm, Kubernetes and SkyPilot.
Its task is `src/{name}/task.py` (settings, data, model, loss, metric), its run `configs/{name}.toml`.

```bash
make run     # {name}'s task on 2 emulated nodes (CPU)
make test    # linters + the tests: the template's machinery tests and tests/test_{name}.py
make update-template   # the template's later fixes, with no conflict (fork.toml records its commit)
```

What {name} sets and where, and what the template keeps: [docs/FORKING.md](docs/FORKING.md).
"""
    files = {"README.md": readme.encode(), PROJECT: text.encode()}
    if "apolo" in kept:
        platform = git.read(template, commit, ".neuro/project.yml")
        if platform is not None:
            platform_text = re.sub(r"^id: .*$", f"id: {name}", platform.decode(), count=1, flags=re.M)
            # The data volume's folder: the fork's data, not the template's task's.
            platform_text = re.sub(r"^(    local: )data/.*$", rf"\g<1>data/{name}", platform_text, count=1, flags=re.M)
            if "notebooks" not in kept:  # `neuro-flow upload ALL` fails on a volume whose local folder is missing
                platform_text = platform_text.replace("    local: notebooks\n", "")
            files[".neuro/project.yml"] = platform_text.encode()
    owned = {p for part in kept for p, owner in declaration.parts[part].patterns.items() if owner == "fork"}
    unknown = owned - set(files) - ({".neuro/project.yml"} if "apolo" in kept else set())
    if unknown:
        raise UpkeepError(f"new-fork: no starting content for the fork-owned {sorted(unknown)}; "
                          "write it in distqa/upkeep/new_fork.py.")
    return files


def new_fork(template: Path, name: str, destination: Path, without: list[str], upstream: str | None) -> str:
    """Create the fork ``name`` at ``destination`` from the template checkout ``template``; returns a summary."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name in RESERVED:
        raise UpkeepError(f"NAME {name!r}: a fork's name is its task's package: lowercase letters, digits and '_', "
                          f"starting with a letter, and none of {sorted(RESERVED)}.")
    if destination.exists() and any(destination.iterdir()):
        raise UpkeepError(f"DIR {destination}: exists and is not empty; name a new folder.")
    if git.dirty(template):
        raise UpkeepError("the template checkout has uncommitted changes; commit them first: the fork records the "
                          "template commit it copies.")
    commit = git.text(template, "rev-parse", "HEAD")
    declaration = Declaration.parse(required(template, commit, DECLARATION))
    left_out = declaration.with_requirements(without)
    kept = set(declaration.parts) - left_out
    files: dict[str, tuple[bytes, str]] = {}
    for path, entry in git.tree(template, commit).items():
        placement = declaration.place(path)
        if placement and placement.part in kept and placement.template_owned:
            files[path] = (git.blob(template, entry.blob), entry.mode)
    for path, content in {**fork_owned_files(template, commit, declaration, name, kept),
                          **stub_files(template, commit, name)}.items():
        files[path] = (content, "100644")
    destination.mkdir(parents=True, exist_ok=True)
    for path, (content, mode) in files.items():
        target = destination / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(0o755 if mode == "100755" else 0o644)
    if upstream is None:
        origin = subprocess.run(["git", "-C", str(template), "remote", "get-url", "origin"], capture_output=True,
                                text=True)
        upstream = origin.stdout.strip() if origin.returncode == 0 else str(template.resolve())
    ForkRecord(upstream, commit, tuple(sorted(left_out))).write(destination)
    subprocess.run(["git", "init", "--quiet", "--initial-branch", "main", str(destination)], check=True)
    made = git.commit_all(destination, f"Start {name} from the distqa template at {commit[:12]} (make new-fork)")
    return (f"{destination}: {name}, from the template at {commit[:12]} ({len(files)} files, commit {made[:12]}), "
            f"parts left out: {', '.join(sorted(left_out)) or 'none'}; next: cd {destination} && make run")
