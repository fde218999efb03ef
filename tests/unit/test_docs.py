"""Every command the documentation writes exists. README.md, docs/*.md and tests/README.md are read for the
commands of their fenced code blocks and inline code spans, and each is checked against the repository:

- `make TARGET` against the Makefile's rules (and the flags in `ARGS="…"` against what the rule runs);
- `python -m distqa.MODULE --flag …` (also `.venv/bin/python -m`, `torchrun … -m`) against the module's
  file under src/distqa and the flags its own `--help` prints;
- `scripts/NAME --option` against the script's usage text (its header comment, which `--help` prints),
  and for the launchers the trainer flags after `--` against `distqa.train` (`distqa.doctor` with
  `--doctor`); `bench/NAME --option` against the benchmark's source;
- every repository path written in code (src/, scripts/, configs/, docs/, …) against the files, a
  `tests/FILE.py::test_name` against the test functions of that file;
- every relative Markdown link against its file and, for `#anchor`, the headings of that file.

The platform CLIs' command lines (neuro-flow, apolo) are checked by tests/launchers/test_platform_cli.py."""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distqa.upkeep.ownership import Declaration

from support.processes import clean_env
from support.repo import REPO_ROOT

IS_FORK = (REPO_ROOT / "fork.toml").is_file()
OWNERSHIP = Declaration.parse((REPO_ROOT / "template.toml").read_text())
PAGES = ["README.md", *sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").glob("*.md")),
         "tests/README.md"]
DOCUMENTS = [name for name in PAGES if not (IS_FORK and (placed := OWNERSHIP.place(name)) and placed.template_owned)]
"""README.md, docs/*.md and tests/README.md (the tests' map, whose paths rot as files move); in a fork (fork.toml),
the fork's own of them: the template's pages describe the template, parts a fork may have left out included, and the
template's own checks run them."""
PATH_PREFIXES = ("src/", "scripts/", "configs/", "docs/", "data/", "tests/", "bench/", "notebooks/", "examples/",
                 "deploy/", ".neuro/")
FORK_PLACEHOLDER = "mytask"
"""The name docs/FORKING.md gives a fork's own files (src/mytask/task.py, configs/mytask.toml): not ours to check."""
# The scripts whose arguments after a lone `--` go to `python -m distqa.train` (to distqa.doctor when the
# script's own options include --doctor), as their usage texts say.
LAUNCHERS = {"scripts/worker.sh", "scripts/run_distributed_locally.sh", "scripts/run_distributed_on_platform.sh",
             "scripts/train_slurm.sbatch", "scripts/train_synthetic_nq.sh"}
# What the test must find in the documents at least, so that it cannot pass by reading nothing.
MINIMUM_FOUND = {"make": 25, "module": 20, "flag": 30, "script": 60, "script option": 25, "path": 120, "link": 35}


@dataclass(frozen=True)
class FlagUse:
    """`flags` written after `command` in `document`, which `module` must accept."""
    document: str
    command: str
    module: str
    flags: tuple[str, ...]


@dataclass
class Report:
    found: Counter[str] = field(default_factory=Counter)
    problems: dict[str, list[str]] = field(default_factory=dict)
    flag_uses: list[FlagUse] = field(default_factory=list)

    def problem(self, kind: str, document: str, command: str, what: str) -> None:
        self.problems.setdefault(kind, []).append(f"{document}: `{command}`: {what}")


# --- reading the documents ----------------------------------------------------------------------------

def code_pieces(text: str) -> list[str]:
    """In document order: each line of the fenced code blocks (a line ending in a backslash joined to
    the next) and each inline code span (its line breaks as spaces) of a Markdown text."""
    pieces: list[str] = []
    outside: list[str] = []
    in_block, pending = False, ""

    def spans() -> None:
        pieces.extend(re.sub(r"\s+", " ", s) for s in re.findall(r"`([^`]+)`", "\n".join(outside)))
        outside.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            spans()
            in_block = not in_block
        elif in_block:
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                pieces.append(pending)
                pending = ""
        else:
            outside.append(line)
    spans()
    return pieces


def without_code_blocks(text: str) -> str:
    """A Markdown text without its fenced code blocks (a `# comment` in a block is no heading)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"`[^`]+`", "", without_code_blocks(text))


def commands(text: str) -> list[list[str]]:
    """The words of every command in the code of a Markdown text: pieces split at ; && || |, comments
    dropped."""
    found = []
    for piece in code_pieces(text):
        for segment in re.split(r"&&|\|\||;|\|", piece):
            segment = re.sub(r"(^|\s)#.*", "", segment).strip()
            try:
                words = shlex.split(segment)
            except ValueError:  # an apostrophe in a prose span
                words = segment.split()
            if words:
                found.append(words)
    return found


def long_options(words: list[str]) -> list[str]:
    """The `--option` names among words, without `=value` or punctuation; a lone `--` is not one."""
    return [m.group() for w in words if (m := re.match(r"--[a-zA-Z][\w-]*", w))]


# --- what the repository has --------------------------------------------------------------------------

@functools.cache
def make_rules() -> dict[str, str]:
    """Target -> its recipe, from the `target: …` rules of the Makefile and of the parts' make/*.mk it includes."""
    rules: dict[str, str] = {}
    current: list[str] = []
    makefiles = [REPO_ROOT / "Makefile", *sorted((REPO_ROOT / "make").glob("*.mk"))]
    for line in (line for makefile in makefiles for line in makefile.read_text().splitlines()):
        rule = re.match(r"([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:(?![=:])", line)
        if rule:
            current = rule.group(1).split()
            for target in current:
                rules.setdefault(target, "")
        elif line.startswith("\t"):
            for target in current:
                rules[target] += line + "\n"
        elif line.strip() and not line.startswith("#"):
            current = []
    return rules


def module_file(module: str) -> Path | None:
    """src/distqa/…/NAME.py (or NAME/__main__.py) of a dotted module name, if it exists."""
    base = REPO_ROOT / "src" / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__main__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def usage_text(script: str) -> str:
    """A script's usage: its leading comment block (what its `--help` prints), and `--help` itself when
    the script handles it; for a shim that execs `"$PYTHON" -m MODULE "$@"`, the module's `--help` too."""
    source = (REPO_ROOT / script).read_text()
    lines = []
    for line in source.splitlines():
        if line.startswith("#") or not line.strip():
            lines.append(line)
        else:
            break
    if re.search(r"^\s*(-h\|)?--help\)", source, flags=re.M):
        lines.append("--help")
    shim = re.search(r'^exec "\$PYTHON" -m ([\w.]+) "\$@"$', source, flags=re.M)
    if shim:
        lines += ["--help", help_texts({shim[1]})[shim[1]]]
    return "\n".join(lines)


_HELP: dict[str, str] = {}
# `python -m MODULE --help` for each module named on the command line, in one process (each import of
# torch costs seconds): run as `python -m` runs a module, its output and exit status collected; with
# `--task NAME` in the help, `--task T --help` of every registered task T too, since train's help may show
# only the chosen task's.
_HELP_DRIVER = """
import contextlib, io, json, runpy, sys
from distqa.tasks import REGISTERED
out = {}
for module in sys.argv[1:]:
    texts = []
    for extra in ([], *(["--task", task] for task in REGISTERED)):
        if extra and "--task" not in texts[0]:
            break
        buffer, status = io.StringIO(), 0
        sys.argv = [module, *extra, "--help"]
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                status = exit.code or 0
        texts.append(buffer.getvalue() if status == 0 else f"EXIT {status}: {buffer.getvalue()}")
    out[module] = "\\n".join(texts)
print(json.dumps(out))
"""


def help_texts(modules: set[str]) -> dict[str, str]:
    """`--help` of each module, fetched once per test session."""
    missing = sorted(modules - _HELP.keys())
    if missing:
        result = subprocess.run([sys.executable, "-c", _HELP_DRIVER, *missing], cwd=REPO_ROOT, env=clean_env(),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"--help of {missing} failed:\n{result.stdout}\n{result.stderr}"
        _HELP.update(json.loads(result.stdout.splitlines()[-1]))
    return {m: _HELP[m] for m in modules}


def accepted_flags(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-zA-Z][\w-]*", help_text))


def defined_tests(path: Path) -> set[str]:
    return set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), flags=re.M))


@functools.cache
def ignored_by_git(path: str) -> bool:
    """A path the repository ignores: what a command writes (data/nq-cache/, data/nq-synthetic/, …)."""
    return subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", "--no-index", path],
                          capture_output=True).returncode == 0


def github_anchor(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", without_code_blocks(path.read_text()), flags=re.M):
        anchor = github_anchor(heading)
        n = 0
        while (anchor if n == 0 else f"{anchor}-{n}") in found:
            n += 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found


# --- the checks -------------------------------------------------------------------------------------

def check_paths(report: Report, document: str, words: list[str], last_test_file: list[str]) -> None:
    command = " ".join(words)
    for before, word in zip(["", *words], words, strict=False):
        word = word.strip("\"'(),;:").rstrip(".")
        if re.fullmatch(r"[\d.]+", before):  # a rate, as in `478.5 examples/s`
            continue
        if word.startswith("…::") and last_test_file:  # `…::test_name`: the test file named just before
            word = last_test_file[0] + word[1:]
        if not word.startswith(PATH_PREFIXES) or re.search(r"[<>…*{}$]", word) or FORK_PLACEHOLDER in word:
            continue
        path, _, test = word.partition("::")
        report.found["path"] += 1
        if not (REPO_ROOT / path).exists():
            if not ignored_by_git(path):
                report.problem("path", document, command, f"{path} does not exist")
            continue
        if test:
            last_test_file[:] = [path]
            name = test.split("[", 1)[0]
            if name not in defined_tests(REPO_ROOT / path):
                report.problem("path", document, command, f"{path} has no test function {name}")


def check_command(report: Report, document: str, words: list[str]) -> None:
    command = " ".join(words)
    if words[0] == "make":
        for word in words[1:]:
            if word.startswith("-") or "=" in word:
                continue
            report.found["make"] += 1
            if word not in make_rules():
                report.problem("make", document, command, f"the Makefile has no target '{word}'")
                continue
            args = [w.removeprefix("ARGS=") for w in words if w.startswith("ARGS=")]
            line = next((r for r in make_rules()[word].splitlines() if "$(ARGS)" in r), "")
            receiver = re.search(r"-m (distqa[\w.]*)|(scripts/[\w.-]+)", line)
            flags = long_options(shlex.split(" ".join(args)))
            if flags and receiver and receiver.group(1):
                report.flag_uses.append(FlagUse(document, command, receiver.group(1), tuple(flags)))
            elif flags and receiver:  # a script: its own options, and the trainer's when it is a launcher
                script = receiver.group(2)
                unknown = tuple(f for f in flags if f not in accepted_flags(usage_text(script)))
                if unknown and script in LAUNCHERS:
                    report.flag_uses.append(FlagUse(document, command, "distqa.train", unknown))
                elif unknown:
                    report.problem("script", document, command, f"{script}'s usage has no {', '.join(unknown)}")
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1].startswith("distqa") and not re.search(r"[<>…]", words[i + 1]):
            module = words[i + 1].rstrip(".,;:)")
            report.found["module"] += 1
            if module_file(module) is None:
                report.problem("module", document, command, f"no module {module} under src/distqa")
                continue
            rest = words[i + 2:]
            rest = rest[:rest.index("--")] if "--" in rest else rest
            if long_options(rest):
                report.flag_uses.append(FlagUse(document, command, module, tuple(long_options(rest))))
    for i, word in enumerate(words):
        if re.fullmatch(r"[\w.-]+\.(sh|sbatch)", word) and (REPO_ROOT / "scripts" / word).is_file():
            word = f"scripts/{word}"  # `worker.sh --stop-after` in prose: the script of scripts/
        elif not re.fullmatch(r"(scripts|bench)/[\w.-]+", word):
            continue
        report.found["script"] += 1
        if not (REPO_ROOT / word).is_file():
            report.problem("script", document, command, f"{word} does not exist")
            continue
        rest = words[i + 1:]
        end = next((k for k, w in enumerate(rest) if w in ("--", "-m") or w.endswith("python")), len(rest))
        own = long_options(rest[:end])
        report.found["script option"] += len(own)
        known = usage_text(word) if word.startswith("scripts/") else (REPO_ROOT / word).read_text()
        unknown = [o for o in own if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", known)]
        if unknown:
            where = "usage text" if word.startswith("scripts/") else "source"
            report.problem("script", document, command, f"{word}'s {where} has no {', '.join(unknown)}")
        if word in LAUNCHERS and end < len(rest) and rest[end] == "--" and long_options(rest[end + 1:]):
            module = "distqa.doctor" if "--doctor" in own else "distqa.train"
            report.flag_uses.append(FlagUse(document, command, module, tuple(long_options(rest[end + 1:]))))


def check_links(report: Report, document: str, text: str) -> None:
    base = (REPO_ROOT / document).parent
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        report.found["link"] += 1
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else REPO_ROOT / document
        relative = str(file.relative_to(REPO_ROOT)) + ("/" if path.endswith("/") else "")
        if not file.exists():
            report.problem("link", document, target, f"{relative} does not exist")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            report.problem("link", document, target, f"{relative} has no heading with the anchor #{anchor}")


def check_flags(report: Report) -> None:
    texts = help_texts({use.module for use in report.flag_uses})
    for use in report.flag_uses:
        report.found["flag"] += len(use.flags)
        if texts[use.module].startswith("EXIT"):
            report.problem("module", use.document, use.command, f"python -m {use.module} --help failed: "
                           f"{texts[use.module][:500]}")
            continue
        unknown = [f for f in use.flags if f not in accepted_flags(texts[use.module])]
        if unknown:
            report.problem("module", use.document, use.command,
                           f"python -m {use.module} accepts no {', '.join(unknown)} (not in its --help)")


def check(documents: dict[str, str]) -> Report:
    """Every check on the given {document name: Markdown text}."""
    report = Report()
    for document, text in documents.items():
        last_test_file: list[str] = []
        for words in commands(text):
            check_command(report, document, words)
            check_paths(report, document, words, last_test_file)
        check_links(report, document, text)
    check_flags(report)
    return report


@functools.cache
def documented() -> Report:
    return check({name: (REPO_ROOT / name).read_text() for name in DOCUMENTS})


# --- the tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["make", "module", "script", "path", "link"])
def test_every_documented_command_path_and_link_exists(kind: str) -> None:
    problems = documented().problems.get(kind, [])
    assert not problems, f"{len(problems)} documented {kind}(s) the repository lacks:\n" + "\n".join(problems)


@pytest.mark.skipif(IS_FORK, reason="the template's pages: a fork checks its own (its README) only")
def test_the_documents_hold_enough_commands_to_check() -> None:
    """The checker read the documents: it found at least as many of each kind as the README and docs/
    held when this test was written (fewer means the extraction broke, or the docs lost them)."""
    found = documented().found
    short = {kind: found[kind] for kind, least in MINIMUM_FOUND.items() if found[kind] < least}
    assert not short, f"found fewer than {MINIMUM_FOUND}: {dict(found)}"
    assert {"README.md", "docs/PLATFORM.md", "docs/FAULT_TOLERANCE.md"} <= set(DOCUMENTS)


@pytest.mark.skipif(IS_FORK, reason="its made-up page names the template's default run, the tiny-cpu preset")
def test_the_checker_refuses_what_does_not_exist() -> None:
    made_up = """Run `make no-such-target` first.

```bash
python -m distqa.train --no-such-flag 3 --preset tiny-cpu
torchrun --standalone -m distqa.no_such_module --preset tiny-cpu
scripts/worker.sh --nnodes 2 --no-such-option -- --max-steps 5 --no-such-trainer-flag
scripts/no_such_script.sh
make run ARGS="--max-steps 5 --no-such-make-flag"
```

See `src/distqa/no_such_file.py`, `tests/unit/test_config.py::test_no_such_test` and [a page](docs/NO_SUCH.md),
[a heading](README.md#no-such-heading).
"""
    report = check({"made-up.md": made_up})
    problems = "\n".join(p for kind in report.problems.values() for p in kind)
    for expected in [
        "made-up.md: `make no-such-target`: the Makefile has no target 'no-such-target'",
        "`python -m distqa.train --no-such-flag 3 --preset tiny-cpu`: python -m distqa.train accepts no "
        "--no-such-flag (not in its --help)",
        "no module distqa.no_such_module under src/distqa",
        "scripts/worker.sh's usage text has no --no-such-option",
        "python -m distqa.train accepts no --no-such-trainer-flag",
        "scripts/no_such_script.sh does not exist",
        "python -m distqa.train accepts no --no-such-make-flag",
        "src/distqa/no_such_file.py does not exist",
        "tests/unit/test_config.py has no test function test_no_such_test",
        "docs/NO_SUCH.md does not exist",
        "README.md has no heading with the anchor #no-such-heading",
    ]:
        assert expected in problems, f"not refused: {expected}\n--- the checker said:\n{problems}"


def test_the_tests_page_reads_in_lines_of_at_most_120_characters() -> None:
    """tests/README.md maps the tiers claim by claim: a bullet per claim, no table row thousands of characters long."""
    long = [number for number, line in enumerate((REPO_ROOT / "tests" / "README.md").read_text().splitlines(), 1)
            if len(line) > 120]
    assert not long, f"tests/README.md lines over 120 characters: {long}"
