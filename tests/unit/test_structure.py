"""The package's shape: imports run downward (no cycle, entry points never import one another), no
import hides inside a function without a comment saying why, shared types stay torch-free, modules stay
small enough to hold one concern (each entry point showing and accepting only its own settings, and the QA tasks'
lazy model side: tests/qa/test_structure_qa.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import clean_env
from support.repo import IN_A_FORK, MACHINERY_ARGS, REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "distqa"
ENTRY_POINTS = {"distqa.train", "distqa.prepare", "distqa.predict", "distqa.evaluate", "distqa.score", "distqa.export",
                "distqa.doctor"}
MAX_MODULE_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def runtime_imports(tree: ast.Module) -> list[tuple[ast.stmt, str, bool]]:
    """(node, imported distqa module, inside a function) for every import that runs; ``if TYPE_CHECKING:``
    blocks are left out (they never run)."""
    found: list[tuple[ast.stmt, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for orelse in child.orelse:
                    visit(orelse, in_function)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                if isinstance(child, ast.ImportFrom) and child.module:
                    # `from distqa.qa.nq import cache` imports the module distqa.qa.nq.cache
                    names += [f"{child.module}.{a.name}" for a in child.names]
                found.extend((child, name, in_function) for name in names if name in MODULES)
                if not any(name in MODULES for name in names):
                    found.append((child, "", in_function))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}
GRAPH = {name: {imported for _, imported, _ in runtime_imports(tree) if imported and imported != name}
         for name, tree in TREES.items()}


def test_the_import_graph_has_no_cycle() -> None:
    """Depth-first search over the imports that run (module level and inside functions alike)."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for imported in sorted(GRAPH[name]):
            if state.get(imported) == "open":
                cycle = [*path[path.index(imported):], imported] if imported in path else [name, imported]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported, [*path, imported])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def test_entry_points_do_not_import_one_another_and_nothing_imports_them() -> None:
    for name, imported in GRAPH.items():
        wrong = sorted(imported & ENTRY_POINTS)
        assert not wrong, f"{name} imports the entry point(s) {wrong}; move what it needs into a library module"


def test_an_import_inside_a_function_says_why() -> None:
    """A comment on the line before (or at the end of) a function-level import gives its reason."""
    unexplained = []
    for name, tree in TREES.items():
        lines = MODULES[name].read_text().splitlines()
        for node, _, in_function in runtime_imports(tree):
            if not in_function:
                continue
            # the comment may open a block of imports: look back over the imports just above
            row = node.lineno - 2
            while row > 0 and lines[row].strip().startswith(("from ", "import ")):
                row -= 1
            before = lines[row].strip()
            if not (before.startswith("#") or "#" in lines[node.lineno - 1]):
                unexplained.append(f"{MODULES[name].relative_to(REPO_ROOT)}:{node.lineno}")
    assert not unexplained, f"imports inside functions without a comment saying why: {unexplained}"


def test_modules_hold_one_concern() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}
    large = {name: size for name, size in sizes.items() if size > MAX_MODULE_LINES}
    assert not large, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {large}"


FORK_API = ["Task", "Batch", "BestMetric", "Evaluation", "Evaluator", "Config", "Section", "ConfigError",
            "resolve_path", "DataError", "BadRecordError", "Runtime", "Precision", "all_gather_tensor",
            "all_gather_objects", "all_reduce_mean", "broadcast_object", "barrier", "on_device"]


def test_what_a_fork_imports_is_one_module_whose_names_stay_put() -> None:
    """distqa.tasks names the fork-facing API (docs/FORKING.md): a name leaves it only with a CHANGELOG.md entry and
    this list changed in the same commit. Importing it loads no torch; each name is the machinery's own object;
    the example and the test fork task import distqa through it alone."""
    code = ("import sys, distqa.tasks as api; assert 'torch' not in sys.modules, 'the registry stays light'; "
            "print(api.__all__); import distqa.config.errors as e, distqa.distributed as d, distqa.tasks.base as b; "
            "assert api.DataError is e.DataError and api.Runtime is d.Runtime and api.Task is b.Task; "
            "[getattr(api, name) for name in api.__all__]")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr(FORK_API), "distqa.tasks.__all__ changed: say so in CHANGELOG.md"
    for path in (REPO_ROOT / "examples/text_classification/task.py", REPO_ROOT / "tests/support/fork_tasks.py"):
        tree = ast.parse(path.read_text())
        used = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("distqa")}
        assert used == {"distqa.tasks"}, f"{path.name} imports distqa through {used}"


def test_a_moved_module_keeps_its_old_name_for_a_release_and_says_the_new_one() -> None:
    """A fork's task written before a module moved (distqa.errors, CHANGELOG.md) keeps importing it across the
    update: the old name gives the same objects, with a warning naming the module to import from instead."""
    code = ("from distqa.errors import DataError; from distqa.config.errors import DataError as New; "
            "assert DataError is New; import distqa.atomic_files as old; assert old.atomic_write")
    result = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code], cwd=REPO_ROOT,
                            env=clean_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "distqa.errors moved: import from distqa.config.errors instead" in result.stderr, result.stderr
    assert "<string>:1: DeprecationWarning" in result.stderr, result.stderr  # the warning names the fork's line


def test_no_test_file_imports_another() -> None:
    """What two test files share (a reference run, arguments, helpers) lives in tests/support/ (the launch helpers,
    the shared runs, tests/support/upkeep.py): a test file is never a library, so a fork may delete one without
    breaking another."""
    tests = REPO_ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(REPO_ROOT)} imports {name}" for name in names
                      if name.split(".")[-1].startswith("test_")]
    assert not found, found


def test_helpers_live_in_tests_support_and_are_imported_by_name_never_from_a_conftest() -> None:
    """A helper is found by its module's name (``from support.runs import run_training``): no file imports a
    conftest.py, which holds fixtures and hooks only; the top of tests/ holds the folders below, the conftest, this
    page and a fork's own test files, and a tier folder only its tests and conftest. No module of tests/support takes
    a standard library module's name: tests/support/sharded_checkpoint_job.py runs as a script, with tests/support
    first on its path."""
    tests = REPO_ROOT / "tests"
    from_conftest = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            from_conftest += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {name}: import it from "
                              "tests/support/ instead" for name in names if name.split(".")[-1] == "conftest"]
    assert not from_conftest, from_conftest
    folders = {"unit", "launchers", "distributed", "qa", "docker", "standin", "fixtures", "support"}
    top = sorted(p.name for p in tests.iterdir() if not p.name.startswith((".", "__pycache__")))
    strays = [name for name in top if name not in {*folders, "conftest.py", "README.md"}
              and not (name.startswith("test_") and name.endswith(".py"))]
    assert not strays, f"helpers belong in tests/support/, tests in a tier folder: {strays}"
    in_tiers = [str(p.relative_to(REPO_ROOT)) for tier in ("unit", "launchers", "distributed", "qa")
                for p in sorted((tests / tier).glob("*.py"))
                if p.name not in {"__init__.py", "conftest.py"} and not p.name.startswith("test_")]
    assert not in_tiers, f"helpers belong in tests/support/: {in_tiers}"
    shadowing = sorted(p.stem for p in (tests / "support").glob("*.py") if p.stem in sys.stdlib_module_names)
    assert not shadowing, f"tests/support/ modules named as standard library modules: {shadowing}"


TIERS = ("unit", "launchers", "distributed")


@pytest.mark.skipif(IN_A_FORK, reason="a fork's own tests live at the top of tests/ (tests/test_<task>.py)")
def test_the_machinery_tests_are_in_the_tier_folders() -> None:
    """tests/unit (in process, or a short-lived subprocess), tests/launchers (the launchers and engines) and
    tests/distributed (real multi-process runs); the QA tasks' in tests/qa, the image's in tests/docker. None at the
    top of tests/: that is where a fork's own go."""
    tests = REPO_ROOT / "tests"
    assert sorted(p.name for p in tests.glob("test_*.py")) == []
    for tier in TIERS:
        assert (tests / tier / "__init__.py").is_file(), f"tests/{tier} is a package (its conftest is {tier}.conftest)"
        assert list((tests / tier).glob("test_*.py")), f"tests/{tier} holds no test file"


def test_only_the_distributed_tier_is_marked_distributed_and_by_its_folder() -> None:
    """tests/distributed/conftest.py marks every test under it ``distributed`` (``make test-fast`` leaves them out);
    no test of tests/unit or tests/launchers is marked so, and none of tests/distributed by hand as well."""
    tests = REPO_ROOT / "tests"
    marked = [str(path.relative_to(REPO_ROOT)) for tier in TIERS for path in sorted((tests / tier).glob("test_*.py"))
              if any(ast.unparse(node) == "pytest.mark.distributed" for node in ast.walk(ast.parse(path.read_text())))]
    assert marked == []
    assert "item.add_marker(pytest.mark.distributed)" in (tests / "distributed" / "conftest.py").read_text()


def test_shared_types_and_helpers_import_no_torch() -> None:
    """The small shared modules and `score`'s dispatch stay importable without torch, so no caller needs a lazy
    import to stay light (the QA tasks' shared types and metrics: tests/qa/test_structure_qa.py)."""
    code = ("import sys; import distqa.checkpoint.files, distqa.config.errors, distqa.score; "
            "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); print(heavy); sys.exit(bool(heavy))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


MACHINERY_TO_IMPORT = ("distqa.config.sources", "distqa.config.flags", "distqa.tasks", "distqa.tasks.base",
                      "distqa.tasks.step_memory", "distqa.record.throughput", "distqa.doctor", "distqa.prepare",
                      "distqa.train")


def test_the_machinery_imports_neither_the_qa_tasks_nor_the_encoder_helpers() -> None:
    """The settings, the registry, the doctor and the entry points a fork keeps load no module of distqa.qa or
    distqa.encoders (the task in use is imported when a run chooses it); the task-neutral halves of the memory
    check and of the MFU, and the settings, stay free of torch too."""
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {MACHINERY_TO_IMPORT!r}]; "
            "print(sorted(m for m in sys.modules if m.startswith(('distqa.qa', 'distqa.encoders'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
    light = ("import sys, distqa.tasks.step_memory, distqa.record.throughput, distqa.config.sources; "
             "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", light], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_a_run_of_a_task_without_transformers_never_imports_it(tmp_path: Path) -> None:
    """Every training process pays its imports at start-up, and transformers (with its hub and tokenizers) is about
    a second of them: a whole run of the machinery's task, which needs none of it (the lr schedule, run.json's and
    the checkpoints' versions, the evaluation, the saves), loads no module of it nor of the encoder helpers."""
    args = [*MACHINERY_ARGS, "--max-steps", "2", "--output-dir", str(tmp_path)]
    hf = ("transformers", "tokenizers", "huggingface_hub", "distqa.encoders")
    code = (f"import sys; from distqa.train import main; code = main({args!r}); "
            f"print(code, sorted(m for m in sys.modules if m.startswith({hf!r})))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "0 []", result.stdout.splitlines()[-1]
    assert (tmp_path / "local" / "checkpoints" / "best.pt").is_file()  # the run went through a save of each kind


def test_every_import_contract_holds_whole() -> None:
    """One contract per family and none with exceptions: a layer crossed on purpose is a module in the wrong family."""
    contracts = [REPO_ROOT / "pyproject.toml", *sorted((REPO_ROOT / "src").rglob("contracts.toml"))]
    assert [path.name for path in contracts if "ignore_imports" in path.read_text()] == []


def test_the_upkeep_runs_from_its_own_folder_for_an_older_forks_update() -> None:
    """An older fork's `make update-template` extracts REF's src/distqa/__init__.py and src/distqa/upkeep alone
    (its own copy of distqa.upkeep.__main__.PACKAGE) and runs them: the upkeep imports nothing else of distqa."""
    outside = {f"{path.name}: {module}" for path in sorted((REPO_ROOT / "src/distqa/upkeep").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom | ast.Import)
               for module in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
               if module.startswith("distqa") and module != "distqa.upkeep" and not module.startswith("distqa.upkeep.")}
    assert outside == set()
