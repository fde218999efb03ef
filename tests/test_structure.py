"""The package's shape: imports run downward (no cycle, entry points never import one another), no
import hides inside a function without a comment saying why, shared types stay torch-free, modules stay
small enough to hold one concern, and each entry point shows and accepts only its own settings."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from distqa import prepare
from distqa.config import ConfigError, fields_of
from distqa.config.flags import (
    build_arg_parser,
    coerce_flag,
    ordered_sections,
    prepare_sections,
    section_fields,
    train_sections,
)
from distqa.qa.nq.config import NQConfig
from distqa.tasks import REGISTERED, task_class

from conftest import MACHINERY_ARGS, REPO_ROOT, clean_env

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


def test_shared_types_and_helpers_import_no_torch() -> None:
    """The small shared modules (and the metric, which `score` runs on machines without a GPU stack)
    stay importable without torch, so no caller needs a lazy import to stay light."""
    code = ("import sys; import distqa.qa.answers, distqa.files, distqa.errors, distqa.qa.nq.metric, distqa.score, "
            "distqa.qa.nq.prepared; "
            "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); print(heavy); sys.exit(bool(heavy))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_qa_tasks_import_their_model_side_only_to_build_a_model() -> None:
    """Choosing a QA task, and preparing its data, loads neither transformers' modeling code nor torch's compiler
    (seconds of imports in every ``distqa.prepare`` the local launcher runs before a run, and in each featurising
    process); building the model loads them."""
    code = ("import sys; from distqa.tasks import task_class; "
            "[task_class(name) for name in ('dummy', 'nq', 'squad')]; "
            "model_side = ('transformers.modeling_utils', 'torch._dynamo', 'distqa.qa.model', 'distqa.qa.inference'); "
            "print(sorted(set(model_side) & set(sys.modules))); "
            "from distqa.config.sources import load_config; from distqa.tasks import make_task; "
            "make_task(load_config(['--task', 'dummy'])).build_model(); "
            "print(sorted(set(model_side[:3]) & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "[]", "['distqa.qa.model', 'torch._dynamo', 'transformers.modeling_utils']"], result.stdout


MACHINERY_TO_IMPORT = ("distqa.config.sources", "distqa.config.flags", "distqa.tasks", "distqa.tasks.base",
                      "distqa.memory", "distqa.throughput", "distqa.doctor", "distqa.prepare", "distqa.train")


def test_the_machinery_imports_neither_the_qa_tasks_nor_the_encoder_helpers() -> None:
    """The settings, the registry, the doctor and the entry points a fork keeps load no module of distqa.qa or
    distqa.encoders (the task in use is imported when a run chooses it); the task-neutral halves of the memory
    check and of the MFU, and the settings, stay free of torch too."""
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {MACHINERY_TO_IMPORT!r}]; "
            "print(sorted(m for m in sys.modules if m.startswith(('distqa.qa', 'distqa.encoders'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=clean_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
    light = ("import sys, distqa.memory, distqa.throughput, distqa.config.sources; "
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


# --- each entry point shows and accepts only its own settings --------------------------------------

def setting_flags(names: Iterable[str]) -> set[str]:
    return {"--" + name.replace("_", "-") for name in names}


ALL_SETTINGS = set().union(*(fields_of(task_class(task).config_class) for task in REGISTERED))
ALL_SECTIONS = ordered_sections(f.metadata["section"] for task in REGISTERED
                                for f in fields_of(task_class(task).config_class).values())
"""The machinery's sections and every registered task's own."""


def flags_in(help_text: str) -> set[str]:
    """The settings' flags a --help text shows."""
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", help_text)) & setting_flags(ALL_SETTINGS)


@pytest.mark.parametrize("task", REGISTERED)
def test_train_shows_every_setting_of_its_task_in_its_sections(task: str) -> None:
    """`train --task T --help` shows exactly T's settings, section by section (another task's sections not)."""
    chosen = task_class(task)
    help_text = build_arg_parser(task=chosen).format_help()
    assert flags_in(help_text) == setting_flags(fields_of(chosen.config_class))
    for section in ALL_SECTIONS:
        assert (f"\n{section.title}:\n" in help_text) == (section in train_sections(chosen)), section.title


@pytest.mark.usefixtures("no_torchrun_env")
def test_prepare_shows_and_accepts_only_what_determines_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m distqa.prepare``'s main (the module exits with what it returns), in this process."""
    with pytest.raises(SystemExit) as shown:
        prepare.main(["--task", "nq", "--help"])
    help_text = capsys.readouterr().out
    assert shown.value.code == 0
    assert flags_in(help_text) == setting_flags(section_fields(prepare_sections(task_class("nq")), NQConfig))
    assert "--lr" not in help_text and "--global-batch-size" not in help_text
    with pytest.raises(SystemExit) as refused:
        prepare.main(["--task", "nq", "--lr", "1e-4"])
    assert refused.value.code == 2 and "unrecognized arguments: --lr" in capsys.readouterr().err
    # A training command line is what the launchers pass with --only-if-needed: a run on the DummyDataset
    # needs no features, so this prepares nothing, and the trainer's flags are accepted (and the environment
    # may hold another task's settings).
    monkeypatch.setenv("DISTQA_NQ_CACHE_DIR", str(tmp_path / "cache"))
    assert prepare.main(["--only-if-needed", "--lr", "1e-4"]) == 0
    assert not capsys.readouterr().out and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("module", ["distqa.qa.commands.predict", "distqa.qa.commands.evaluate"])
def test_predict_and_evaluate_show_only_the_settings_they_take_from_flags(module: str) -> None:
    """The rest comes from the checkpoint; the flags they have are the settings' own (same help, same types).
    The QA tasks' commands, which ``python -m distqa.predict|evaluate`` run for their checkpoints."""
    entry_point = importlib.import_module(module)
    help_text = entry_point.build_arg_parser().format_help()
    taken_from_flags = tuple(dict.fromkeys(entry_point.NQ_SETTINGS + entry_point.SQUAD_SETTINGS))
    assert flags_in(help_text) == setting_flags(taken_from_flags)
    assert "--batch-size" in help_text  # the short name, kept for eval_batch_size
    with pytest.raises(ConfigError, match="eval_batch_size: invalid value 'many' from flag --eval-batch-size"):
        coerce_flag("eval_batch_size", "many", NQConfig)
