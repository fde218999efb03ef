"""The task seam in runs: a fork's own settings stopping a resume with other values, and a fork's own entry module
on every node of the local launcher."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.processes import clean_env, free_port
from support.repo import REPO_ROOT
from support.runs import train

pytestmark = pytest.mark.usefixtures("no_torchrun_env")


def test_a_forks_run_defining_setting_stops_a_resume_with_another_value(tmp_path: Path) -> None:
    args = ["--task", "examples.text_classification.task:TextClassification", "--output-dir", str(tmp_path),
            "--max-steps", "2", "--progress-bar", "false", "--tensorboard", "false"]
    assert train(*args).returncode == 0
    refused = train(*args, "--embedding-dim", "16", "--max-steps", "4")
    assert refused.returncode == 2
    assert "belongs to a run with other settings (embedding_dim 32 -> 16)" in refused.stderr


# --- a fork's own entry module on every node -----------------------------------------------------------

def test_the_local_launcher_starts_a_forks_entry_module_on_every_node(tmp_path: Path) -> None:
    (tmp_path / "forkentry.py").write_text(textwrap.dedent("""
        import os, sys
        from pathlib import Path
        Path(sys.argv[-1], f"rank-{os.environ['RANK']}").write_text(" ".join(sys.argv[1:]) + "\\n")
    """))
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()),
                             "--run-id", "fork", "--entry-module", "forkentry", "--", "--my-flag", "1", str(out)],
                            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, PYTHONPATH=str(tmp_path)),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {path.name: path.read_text() for path in out.iterdir()}
    assert lines == {f"rank-{rank}": f"--run-name fork --my-flag 1 {out}\n" for rank in (0, 1)}
    assert "prepare" not in result.stderr  # a fork's module gets its own arguments, not distqa's preparation
