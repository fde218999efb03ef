"""notebooks/inference.ipynb: committed clean, and run top to bottom on a checkpoint trained here."""

from __future__ import annotations

import html
import itertools
import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from support.processes import clean_env
from support.repo import REPO_ROOT
from support.runs import run_training

NOTEBOOK = REPO_ROOT / "notebooks" / "inference.ipynb"
QUESTIONS = REPO_ROOT / "data" / "nq-sample" / "simplified-nq-test.jsonl"
SHOWN = 5
"""Examples the notebook shows (its SHOW)."""
ASKED = "what is the capital of the northern river"
"""The question of its "ask your own question" cell."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny checkpoint of the committed sample (6 steps, evaluated at 3 and 6), its feature cache, and
    the sample's test file and gold as the questions (the notebook's defaults are those of
    `make synthetic-nq`, which takes minutes)."""
    tmp = tmp_path_factory.mktemp("notebook")
    run_training(["--preset", "tiny-cpu", "--task", "nq", "--run-name", "nb", "--output-dir", str(tmp / "results"),
                  "--nq-cache-dir", str(tmp / "cache"), "--max-steps", "6", "--eval-every", "3",
                  "--progress-bar", "false", "--tensorboard", "false"])
    checkpoint = tmp / "results" / "nb" / "checkpoints" / "best.pt"
    assert checkpoint.is_file()
    return {"DISTQA_CHECKPOINT": str(checkpoint), "DISTQA_NQ_CACHE_DIR": str(tmp / "cache"),
            "DISTQA_QUESTIONS": str(QUESTIONS),
            "DISTQA_GOLD": str(QUESTIONS.with_name("simplified-nq-test-gold.jsonl"))}


def committed() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def execute(notebook: nbformat.NotebookNode, tmp_path: Path, **env: str) -> None:
    """Run ``notebook`` in place (in memory, never saved) in a kernel started in notebooks/, as Jupyter does."""
    # No kernel directories: only ipykernel's own "python3" spec, which runs sys.executable, so the
    # kernel is this interpreter whatever kernelspecs the machine has installed.
    manager = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]),
                            connection_file=str(tmp_path / "kernel.json"))
    assert manager.kernel_spec.argv[0] == sys.executable
    client = NotebookClient(notebook, km=manager, timeout=120, resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute(env=clean_env(OMP_NUM_THREADS="1", IPYTHONDIR=str(tmp_path / "ipython"), **env))
    finally:  # nbclient shuts down only a kernel manager it made itself (NotebookClient.owns_km)
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)


def output_text(cell: nbformat.NotebookNode) -> str:
    """Everything a code cell showed: streams, HTML and plain-text results, errors."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
        else:
            parts += [output.data.get("text/html", ""), output.data.get("text/plain", "")]
    return "\n".join(parts)


def test_the_notebook_runs_on_a_fresh_checkpoint(trained: dict[str, str], tmp_path: Path) -> None:
    before = NOTEBOOK.read_bytes()
    notebook = committed()
    execute(notebook, tmp_path, **trained)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(output.output_type != "error" for cell in code for output in cell.outputs)
    shown = "\n".join(output_text(cell) for cell in code)
    with QUESTIONS.open(encoding="utf-8") as file:
        questions = [json.loads(line)["question_text"] for line in itertools.islice(file, SHOWN)]
    for question in [*questions, ASKED]:
        assert f"<h4>{html.escape(question)}</h4>" in shown
    assert any(f"SHOW = {SHOWN}\n" in cell.source for cell in code)
    assert "<mark>" in shown
    assert not any(tag in shown for tag in ("<P>", "</P>", "&lt;P&gt;", "&lt;/P&gt;")), "tag tokens are not shown"
    assert "long threshold" in shown and "gold" in shown
    [score] = [cell for cell in code if "score_answers(" in cell.source]
    assert "<th>micro_f1</th>" in output_text(score)
    assert NOTEBOOK.read_bytes() == before


def test_a_missing_checkpoint_fails_in_the_setup_cell_with_the_command_to_make_it(tmp_path: Path) -> None:
    notebook = committed()
    with pytest.raises(CellExecutionError) as raised:
        execute(notebook, tmp_path, DISTQA_CHECKPOINT=str(tmp_path / "missing.pt"))
    assert raised.value.ename == "FileNotFoundError"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code[0].outputs[-1].output_type == "error" and all(not cell.outputs for cell in code[1:])
    assert "missing.pt" in raised.value.evalue
    assert "make synthetic-nq" in raised.value.evalue


def test_the_committed_notebook_is_valid_and_has_no_outputs() -> None:
    notebook = committed()
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"strip the outputs of cell {cell.id}"
        assert "execution" not in cell.metadata, f"cell {cell.id} keeps its execution times"
