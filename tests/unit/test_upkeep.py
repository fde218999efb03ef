"""A fork keeps up with the template (docs/FORKING.md): every path has an owner and a part (template.toml), a fork
starts with `make new-fork`, and `make update-template` brings the template's later changes with no conflict.

End to end, on a synthetic upstream (tests/support/upkeep.py): the template as this checkout holds it is commit A; a
fork made from A without the QA tasks, Slurm and the notebooks gets its own README, platform names, job flags and an
image dependency; the template then moves to B (machinery, QA files, docs, README, .neuro/live.yml, the Dockerfile
and the Makefile change; a QA preset, a QA test and a machinery test arrive). The update leaves no conflict and no QA
file, keeps the fork's own files, and the fork then passes lint and collects every test it has (its own test's run
through a lost node: tests/distributed/test_upkeep.py)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from distqa.upkeep.git import Entry, tree
from distqa.upkeep.ownership import Declaration, DeclarationError, pattern_regex
from distqa.upkeep.project import main as project_main
from distqa.upkeep.update import changelog_between, changelog_entries, own_project, plan_update

from support.processes import clean_env
from support.repo import REPO_ROOT
from support.upkeep import (
    NAME,
    checkout_files,
    edit,
    git,
    in_fork,
    make,
    template_only,
    upstream_and_fork_fixture,  # noqa: F401  (the fixture `upstream_and_fork`)
)

DECLARATION = Declaration.parse((REPO_ROOT / "template.toml").read_text())


# --- the declaration ------------------------------------------------------------------------------------------------

@template_only
def test_every_path_of_the_template_is_placed_by_exactly_one_pattern() -> None:
    assert DECLARATION.unplaced_or_ambiguous(checkout_files()) == []


def test_docs_forking_md_holds_the_declarations_table() -> None:
    """FORKING.md's table of parts is written from template.toml (`python -m distqa.upkeep table`)."""
    assert DECLARATION.table() in (REPO_ROOT / "docs" / "FORKING.md").read_text()


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("src/distqa/", "src/distqa/qa/model.py", True), ("src/distqa/", "src/distqa", False),
    ("tests/*.py", "tests/test_x.py", True), ("tests/*.py", "tests/qa/test_x.py", False),
    ("tests/**/*.py", "tests/qa/deep/test_x.py", True), ("tests/**/*.py", "tests/test_x.py", True),
    ("Makefile", "Makefile", True), ("Makefile", "make/Makefile", False), ("bench/gpu?.sh", "bench/gpu1.sh", True),
])
def test_a_pattern_is_a_path_a_folder_or_a_glob(pattern: str, path: str, matches: bool) -> None:
    assert bool(pattern_regex(pattern).fullmatch(path)) is matches


def test_the_longest_pattern_places_a_path_and_a_tie_is_reported() -> None:
    declaration = Declaration.parse('[parts.core]\ntemplate = ["src/", "docs/Q*.md"]\nfork = ["README.md"]\n'
                                    '[parts.qa]\ntemplate = ["src/qa/", "docs/QA.md"]\n'
                                    '[parts.other]\ntemplate = ["docs/?B.md"]\n')
    assert declaration.place("src/qa/x.py").part == "qa" and declaration.place("src/x.py").part == "core"
    assert declaration.place("docs/QA.md").part == "qa" and declaration.place("README.md").owner == "fork"
    assert declaration.place("mine/x.py") is None
    assert declaration.unplaced_or_ambiguous(["docs/QB.md", "mine/x.py"]) == [
        "docs/QB.md: placed by 'docs/Q*.md' (core, template) and 'docs/?B.md' (other, template); make one pattern "
        "longer",
        "mine/x.py: no pattern of template.toml places it; add it to a part's template or fork list"]


@pytest.mark.parametrize(("text", "said"), [
    ('[parts.qa]\ntemplate = ["a"]\n', "no [parts.core]"),
    ('[parts.core]\ntemplate = ["a", "a"]\n', "'a' is listed twice"),
    ('[parts.core]\ntemplates = ["a"]\n', "unknown key(s) ['templates']"),
    ('[parts.core]\n[parts.nb]\nrequires = ["qa"]\n', "requires 'qa', which is no part"),
    ('[parts.core]\ntemplate = "a"\n', "template must be a list of path patterns"),
    ("[parts.core\n", "not valid TOML"),
])
def test_a_wrong_declaration_is_one_line_naming_the_key(text: str, said: str) -> None:
    with pytest.raises(DeclarationError, match=re.escape(said)) as raised:
        Declaration.parse(text)
    assert "\n" not in str(raised.value)


def test_leaving_out_a_part_leaves_out_the_parts_that_require_it() -> None:
    assert DECLARATION.with_requirements(["qa"]) == {"qa", "notebooks"}
    with pytest.raises(DeclarationError, match="no part 'core' to leave out"):
        DECLARATION.with_requirements(["core"])


@pytest.mark.parametrize(("content", "said"), [
    ('[run]\nargs = ""\n[jobs]\nargs = ""\n[image]\npython = []\n', "image.apt is not set"),
    ('[run]\nargs = ""\nflags = ""\n', "unknown setting [run] flags"),
    ('[run]\nargs = 3\n', "[run] args must be a string, got 3"),
    ('[run]\nargs = ""\n[jobs]\nargs = ""\n[image]\npython = [1]\napt = []\n', "[image] python must be a list of str"),
])
def test_a_wrong_project_toml_is_one_line_naming_the_setting(content: str, said: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "project.toml").write_text(content)
    assert project_main(["run.args", "--file", str(tmp_path / "project.toml")]) == 2
    assert said in capsys.readouterr().err.strip()
    assert len(capsys.readouterr().err.splitlines()) <= 1


def test_the_template_project_toml_is_complete_and_split_as_a_shell_would(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    assert project_main(["jobs.args", "--file", str(REPO_ROOT / "project.toml")]) == 0
    (tmp_path / "project.toml").write_text("[run]\nargs = \"--run-name 'a b'\"\n[jobs]\nargs = \"\"\n"
                                           "[image]\npython = []\napt = []\n")
    capsys.readouterr()
    assert project_main(["run.args", "--split", "--file", str(tmp_path / "project.toml")]) == 0
    assert capsys.readouterr().out.splitlines() == ["--run-name", "a b"]


def test_the_jobs_flags_take_the_jobs_own_paths_from_its_environment(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """[jobs] args may name ${DISTQA_OUTPUT_DIR}: /project/results in a pod, a bucket on SkyPilot."""
    (tmp_path / "project.toml").write_text('[run]\nargs = ""\n[jobs]\nargs = "--nq-cache-dir ${DISTQA_OUTPUT_DIR}/c"\n'
                                           "[image]\npython = []\napt = []\n")
    monkeypatch.setenv("DISTQA_OUTPUT_DIR", "/bucket/results")
    assert project_main(["jobs.args", "--split", "--file", str(tmp_path / "project.toml")]) == 0
    assert capsys.readouterr().out.splitlines() == ["--nq-cache-dir", "/bucket/results/c"]
    monkeypatch.delenv("DISTQA_OUTPUT_DIR")
    assert project_main(["jobs.args", "--split", "--file", str(tmp_path / "project.toml")]) == 2
    assert capsys.readouterr().err.strip() == (
        "project.toml: jobs.args names ${DISTQA_OUTPUT_DIR}, which this environment does not set; set it in the job, "
        "or write the value itself.")


# --- the update's rules, path by path --------------------------------------------------------------------------------

def test_each_rule_of_the_update() -> None:
    """Template-owned files follow the template; a template-owned file the fork changed stops the update; a left-out
    part never arrives; a fork-owned file is the fork's once changed, follows the template until then, and is written
    when the template first ships it; a file the template stops shipping goes unless the fork changed it."""
    declaration = Declaration.parse('[parts.core]\ntemplate = ["src/", "gone.py", "new.py"]\nfork = ["README.md", '
                                    '"own.toml", "kept.toml", "added.toml"]\n[parts.qa]\ntemplate = ["qa/"]\n'
                                    '[moves]\n"src/" = "your package"\n')
    e = {name: Entry("100644", name) for name in "abcdefgh"}
    base = {"src/m.py": e["a"], "src/edited.py": e["a"], "gone.py": e["a"], "qa/q.py": e["a"], "README.md": e["a"],
            "own.toml": e["a"], "kept.toml": e["a"], "old.txt": e["a"]}
    ref = {"src/m.py": e["b"], "src/edited.py": e["b"], "new.py": e["c"], "qa/q.py": e["b"], "qa/new.py": e["c"],
           "README.md": e["b"], "own.toml": e["b"], "kept.toml": e["b"], "added.toml": e["d"]}
    fork = {"src/m.py": e["a"], "src/edited.py": e["e"], "gone.py": e["a"], "README.md": e["f"], "own.toml": e["a"],
            "kept.toml": e["g"], "old.txt": e["a"]}
    plan = plan_update(declaration, base, ref, fork, {"qa"}, "base", "ref")
    assert plan.stops == ["src/edited.py: your fork changed this template-owned file; put the change in your "
                          "package: restore the file (git checkout base -- src/edited.py), run the update, then make "
                          "the change there."]
    assert plan.writes == {"src/m.py": e["b"], "src/edited.py": e["b"], "new.py": e["c"], "own.toml": e["b"],
                           "added.toml": e["d"]}
    assert sorted(plan.deletes) == ["gone.py", "old.txt"]
    assert plan.notices == ["README.md: yours; the template changed its own version (git diff base ref -- README.md)",
                            "kept.toml: yours; the template changed its own version (git diff base ref -- kept.toml)"]
    collision = plan_update(declaration, {}, {"new.py": e["c"]}, {"new.py": e["h"]}, set(), "base", "ref")
    assert collision.stops == ["new.py: the template now ships this path, which your fork has as its own file; "
                               "rename yours, then run the update again."]


def test_the_update_prints_the_changelog_entries_new_to_the_fork_those_needing_an_edit_first() -> None:
    base = b"# Changelog\n\n## 0.1\n\n- an old change\n"
    ref = (b"# Changelog\n\nProse about the policy.\n\n## 0.2\n\n"
           b"- [edit] `a.b` is removed: write\n  `from c import b`.\n- a new flag\n\n## 0.1\n\n- an old change\n")
    assert changelog_between(base, ref) == [
        "CHANGELOG.md: 2 change(s) since your template commit, 1 needing an edit in your fork (marked EDIT; do it "
        "before your next run):", "  EDIT `a.b` is removed: write `from c import b`.", "  - a new flag"]
    assert changelog_between(None, ref)[0].startswith("CHANGELOG.md: 3 change(s)"), "a fork from before it: all"
    assert changelog_between(ref, ref) == []
    assert changelog_entries((REPO_ROOT / "CHANGELOG.md").read_bytes()), "the template's own changelog has entries"


def test_a_fork_without_the_qa_tasks_gets_a_first_project_toml_naming_its_own_preset() -> None:
    """A fork made before project.toml existed, that left the QA part out: the update writes the file with its own
    preset (its one preset under configs/), never the template's QA preset, which that fork does not have."""
    template = (REPO_ROOT / "project.toml").read_text()
    e = Entry("100644", "x")
    fork = {"configs/mytask.toml": e, "src/mytask/task.py": e, "configs/sweeps/s.toml": e}
    text, notice = own_project(template, fork)
    project = tomllib.loads(text.decode())
    assert project["run"]["args"] == project["jobs"]["args"] == "--preset mytask"
    assert project["image"] == tomllib.loads(template)["image"]  # the rest as the template's
    assert notice == ("project.toml: new, yours (docs/FORKING.md, \"What a fork sets\"); its [run] and [jobs] args "
                      "are '--preset mytask'")
    text, notice = own_project(template, {"configs/a.toml": e, "configs/b.toml": e})
    assert tomllib.loads(text.decode())["jobs"]["args"] == "" and notice.endswith("set its [run] and [jobs] args to "
                                                                                  "your preset")

# --- the machinery's tests need no optional part ---------------------------------------------------------------------

def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def test_no_core_test_imports_the_qa_package() -> None:
    """A fork that leaves the QA tasks out keeps every core test (template.toml): none of them imports distqa.qa, so
    none fails at collection there; the QA tasks' own tests live in tests/qa/."""
    core_tests = [p for p in (REPO_ROOT / "tests").rglob("*.py")
                  if (placed := DECLARATION.place(str(p.relative_to(REPO_ROOT)))) and placed.part == "core"]
    assert len(core_tests) > 20
    offenders = {str(p.relative_to(REPO_ROOT)): sorted(m for m in imported_modules(p)
                                                       if m == "distqa.qa" or m.startswith("distqa.qa."))
                 for p in core_tests}
    assert {path: found for path, found in offenders.items() if found} == {}


@template_only
def test_the_update_leaves_no_conflict_and_takes_every_template_change(upstream_and_fork) -> None:
    template, fork, _, said = upstream_and_fork
    assert git(fork, "status", "--porcelain") == "", "the update is committed whole"
    assert git(fork, "log", "--format=%s", "-1").startswith("Take the template's changes")
    b = git(template, "rev-parse", "main").strip()
    assert f'commit = "{b}"' in (fork / "fork.toml").read_text()
    assert 'left_out = ["notebooks", "qa", "slurm"]' in (fork / "fork.toml").read_text()
    kept = {name for name in DECLARATION.parts} - {"notebooks", "qa", "slurm"}
    upstream, mine = tree(template, "main"), tree(fork, "HEAD")
    for path, entry in upstream.items():
        placed = DECLARATION.place(path)
        if placed.part in kept and placed.template_owned:
            assert mine.get(path) == entry, f"{path} is not the template's B"
    assert "tests/test_upstream_machinery.py" in mine
    assert not [line for path in mine for line in [(fork / path).read_text(errors="replace")]
                if re.search(r"^(<{7}|>{7}) ", line, re.M)], "no conflict markers"
    assert "committed" in said and "README.md: yours; the template changed its own version" in said
    assert "CHANGELOG.md: 1 change(s) since your template commit, 1 needing an edit" in said, said
    assert "  EDIT `distqa.upstream` moved: write `from x import y`." in said, "only the entry after the fork's commit"


@template_only
def test_a_left_out_part_stays_out_and_the_forks_own_files_stay(upstream_and_fork) -> None:
    _, fork, before, _ = upstream_and_fork
    mine = tree(fork, "HEAD")
    out = sorted(p for p in mine if (placed := DECLARATION.place(p)) and placed.part in {"qa", "notebooks", "slurm"})
    assert out == [f"configs/{NAME}.toml"], "no file of a left-out part; the fork's preset is its own"
    assert "configs/upstream-qa.toml" not in mine and "tests/qa/test_upstream_qa.py" not in mine
    for own in ("README.md", "project.toml", ".neuro/project.yml", f"src/{NAME}/task.py", f"tests/test_{NAME}.py"):
        assert git(fork, "show", f"{before}:{own}") == (fork / own).read_text(), f"{own} is the fork's"


@template_only
def test_a_fork_that_changed_a_template_file_or_has_uncommitted_changes_is_refused_and_left_as_it_is(
        upstream_and_fork, tmp_path: Path) -> None:
    template, fork, _, _ = upstream_and_fork
    copy = tmp_path / "copy"
    subprocess.run(["git", "clone", "--quiet", str(fork), str(copy)], check=True, timeout=60)
    shutil.copy2(fork / "fork.toml", copy / "fork.toml")
    edit(copy / "Dockerfile", "FROM ${BASE_IMAGE}\n", "FROM ${BASE_IMAGE}\nRUN echo ours\n")
    dirty = make(copy, "update-template", f"UPSTREAM={template}")
    assert dirty.returncode != 0
    assert [line for line in dirty.stderr.splitlines() if line.startswith("update:")] == [
        "update: the working tree has uncommitted changes (1, e.g. Dockerfile); commit or stash them, then run the "
        "update again."]
    git(copy, "commit", "--quiet", "--all", "-m", "our own Dockerfile line")
    head = git(copy, "rev-parse", "HEAD")
    edited = make(copy, "update-template", f"UPSTREAM={template}")
    lines = [line for line in edited.stderr.splitlines() if line.startswith("update:")]
    assert edited.returncode != 0 and len(lines) == 1, edited.stderr
    assert lines[0].startswith("update: Dockerfile: your fork changed this template-owned file; put the change in "
                               "project.toml, [image]")
    unknown = make(copy, "update-template", f"UPSTREAM={template}", "REF=no-such-tag")
    assert [line for line in unknown.stderr.splitlines() if line.startswith("update:")] == [
        f"update: REF 'no-such-tag' is neither a branch, a tag nor a commit of {template}; name one that is "
        f"(git ls-remote {template} lists them)."]
    assert git(copy, "rev-parse", "HEAD") == head and git(copy, "status", "--porcelain") == ""


@template_only
def test_the_updated_fork_passes_lint_and_collects_every_test_it_has(upstream_and_fork) -> None:
    _, fork, _, _ = upstream_and_fork
    contracts = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--no-logo"],
                               cwd=fork, env=clean_env(PYTHONPATH=str(fork / "src")), capture_output=True, text=True,
                               timeout=300)
    assert contracts.returncode == 0, contracts.stdout + contracts.stderr
    ruff = subprocess.run([str(Path(sys.executable).parent / "ruff"), "check", "--no-cache", "src", "tests"],
                          cwd=fork, capture_output=True, text=True, timeout=120)
    assert ruff.returncode == 0, ruff.stdout
    collected = in_fork(fork, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert f"tests/test_{NAME}.py::test_{NAME}_resumes" in collected.stdout
    assert "tests/test_upstream_machinery.py::test_upstream_machinery" in collected.stdout
    assert not [line for line in collected.stdout.splitlines() if line.startswith("tests/qa/")]
    dry_run = make(fork, "-n", "run")
    assert '--split run.args' in dry_run.stdout, dry_run.stdout
    said = in_fork(fork, "src/distqa/upkeep/project.py", "--split", "run.args")
    assert said.stdout.split() == ["--preset", NAME], "make run trains the fork's task"
    settings = in_fork(fork, "-m", "distqa.train", "--preset", f"configs/{NAME}.toml", "--help")
    assert settings.returncode == 0 and "--embedding-dim" in settings.stdout and "Traceback" not in settings.stderr
