"""The core is task-neutral: outside ``src/distqa/qa/`` no module, and none of the template-owned defaults a fork
without the QA tasks keeps (``.neuro/live.yml``, ``deploy/``), names a QA task or a QA preset, except the registry's
tables of the built-in tasks (``REGISTERED`` and ``LIGHT_COMMANDS`` in src/distqa/config/registry.py), which a fork
that deleted the QA package keeps as they are (``available_tasks`` leaves out what is gone)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from support.repo import REPO_ROOT

QA_TASKS = ("nq", "squad")
"""The QA tasks: their names, found in the presets and settings named after them too (``bert-base-nq``,
``--nq-cache-dir``, ``tiny-synthetic-squad``)."""

REGISTRY = REPO_ROOT / "src" / "distqa" / "config" / "registry.py"
REGISTRY_TABLES = ("REGISTERED", "LIGHT_COMMANDS")


def qa_presets() -> set[str]:
    """The presets under configs/ whose task is a QA task (none where the QA part was left out)."""
    presets = set()
    for path in (REPO_ROOT / "configs").glob("*.toml"):
        if tomllib.loads(path.read_text()).get("task") in QA_TASKS:
            presets.add(path.stem)
    return presets


def qa_names() -> re.Pattern[str]:
    words = [*QA_TASKS, *sorted(qa_presets())]
    # A name between anything but letters and digits: `nq`, `--nq-cache-dir`, `DISTQA_NQ_CACHE_DIR`, `qa.nq.task`.
    return re.compile(r"(?<![a-z0-9])(?:" + "|".join(map(re.escape, words)) + r")(?![a-z0-9])", re.IGNORECASE)


def registry_lines() -> set[int]:
    """The lines of the registry's tables of the built-in tasks: the one place outside distqa/qa that names them."""
    lines: set[int] = set()
    for node in ast.parse(REGISTRY.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in REGISTRY_TABLES for t in node.targets):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def scanned_files() -> list[Path]:
    """The task-neutral files: the package outside qa/, and the template-owned defaults of the optional parts a fork
    without the QA tasks may keep."""
    package = REPO_ROOT / "src" / "distqa"
    files = [p for p in package.rglob("*.py") if (package / "qa") not in p.parents]
    files += [p for p in [REPO_ROOT / ".neuro" / "live.yml", *sorted((REPO_ROOT / "deploy").rglob("*"))]
              if p.is_file()]
    return sorted(files)


def qa_mentions(path: Path, pattern: re.Pattern[str], allowed: set[int]) -> list[str]:
    return [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
            for number, line in enumerate(path.read_text().splitlines(), start=1)
            if pattern.search(line) and number not in allowed]


def test_no_core_module_or_template_default_names_a_qa_task() -> None:
    pattern = qa_names()
    found = [mention for path in scanned_files()
             for mention in qa_mentions(path, pattern, registry_lines() if path == REGISTRY else set())]
    assert not found, ("the core names a QA task; take it from the task, the preset or project.toml, or move the "
                       "text to distqa/qa or the QA docs:\n" + "\n".join(found))


@pytest.mark.parametrize(("line", "named"), [
    ('HELP_TASK = "nq"', True), ("    python -m distqa.doctor --preset bert-base-nq", True),
    ("its NQ feature cache", True), ("--nq-cache-dir /data", True), ("DISTQA_NQ_CACHE_DIR: x", True),
    ("tiny-synthetic-squad", True), ("a SQuAD file", True), ("--preset bert-base", False),
    ("bert-base-uncased", False), ("inquire", False), ("distqa.qa.nq.commands", True)])
def test_the_scan_finds_what_it_should(line: str, named: bool) -> None:
    """The pattern catches a task name however it is written (a word, in a preset or a flag's name), and nothing
    that merely contains its letters."""
    assert bool(qa_names().search(line)) is named
