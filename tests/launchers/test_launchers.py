"""One way to start a node: every launcher (local emulation, Docker test, Slurm, platform) runs
scripts/worker.sh; the torchrun command line, the thread settings and the rendezvous environment live
there alone, and finding PYTHON and reading .env live in one sourced helper (scripts/common.sh) (the QA data
scripts' use of it: tests/qa/test_qa_scripts.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import clean_env, free_port
from support.repo import MACHINERY_ARGS, REPO_ROOT

CANDIDATE_FILES = [*(REPO_ROOT / "scripts").iterdir(), *(REPO_ROOT / "tests" / "docker").glob("*.sh"),
                   REPO_ROOT / ".ci" / "run", REPO_ROOT / "Makefile", REPO_ROOT / "Dockerfile",
                   REPO_ROOT / ".neuro" / "live.yml"]
SHELL_FILES = sorted(path for path in CANDIDATE_FILES if path.is_file())  # a fork may leave the platform out


def code_lines(path: Path) -> list[str]:
    """The lines of a script that are not comments."""
    return [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]


PYTHON_FILES = sorted((REPO_ROOT / "src").rglob("*.py"))
NODE = "src/distqa/launch/node.py"


@pytest.mark.parametrize(("what", "shell_pattern", "python_pattern", "home"), [
    ("the torchrun command line", r"torch\.distributed\.run|distqa\.launch\.agent|(^\s*|exec\s+|[;&|]\s*)torchrun\s",
     r"[\"']--rdzv-endpoint[\"']", NODE),
    ("the thread settings", r"OMP_NUM_THREADS=", r"\[[\"']OMP_NUM_THREADS[\"']\] =", NODE),
    ("the rendezvous environment", r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE|rdzv", r"TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
     NODE),
    ("finding PYTHON", r"PYTHON=\"?\$\S*\.venv/bin/python|PYTHON=python|PYTHON=\"\$\{PYTHON:-", None,
     "scripts/common.sh"),
    ("reading .env", r"grep .*=\"? \"?\$|\$\{line#\*=\}", None, "scripts/common.sh"),
])
def test_each_piece_of_starting_a_node_exists_once(what: str, shell_pattern: str, python_pattern: str | None,
                                                   home: str) -> None:
    """Each piece in one file: the node's in distqa.launch.node (no script holds any), the scripts' own in their
    sourced helper."""
    found = {str(path.relative_to(REPO_ROOT)) for path in SHELL_FILES
             for line in code_lines(path) if re.search(shell_pattern, line)}
    if python_pattern:
        found |= {str(path.relative_to(REPO_ROOT)) for path in PYTHON_FILES
                  for line in code_lines(path) if re.search(python_pattern, line)}
    assert sorted(found) == [home], f"{what} is written in {sorted(found)}; it belongs in {home} alone"


def test_every_launcher_starts_its_nodes_through_worker_sh() -> None:
    """In their code; tests/distributed/test_training.py's run of the local launcher shows each node's worker.sh line
    (the engines' own files: tests/docker/test_slurm_cluster.py, tests/distributed/test_platform.py)."""
    for launcher in ("scripts/run_distributed_locally.sh", "tests/docker/test_image.py"):
        assert "scripts/worker.sh" in "\n".join(code_lines(REPO_ROOT / launcher)), launcher


def test_dotenv_values_are_read_as_the_trainer_reads_them(tmp_path: Path) -> None:
    """scripts/common.sh's dotenv_value agrees with python-dotenv (what distqa.train loads .env with)."""
    from dotenv import dotenv_values

    env_file = tmp_path / ".env"
    env_file.write_text("# a comment\nNODES=3  # three nodes\nexport PRESET=\"gpu # large\"  # quoted\n"
                        "KEY = 'abc'\nHASH=abc#def\nEMPTY=\nNODES_2=4 # later\nNODES=5\n")
    script = 'source scripts/common.sh; for k in "$@"; do printf "%s=%s\\n" "$k" "$(dotenv_value "$k" "$F")"; done'
    keys = ["NODES", "PRESET", "KEY", "HASH", "EMPTY", "NODES_2", "MISSING"]
    result = subprocess.run(["bash", "-c", script, "bash", *keys], cwd=REPO_ROOT,
                            env=clean_env(F=str(env_file)), capture_output=True, text=True, timeout=60, check=True)
    values = dict(line.split("=", 1) for line in result.stdout.splitlines())
    expected = {k: (v or "") for k, v in dotenv_values(env_file).items()}
    assert values == {k: expected.get(k, "") for k in keys}


GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


@pytest.mark.skipif(any(Path(node).exists() for node in GPU_DEVICE_NODES), reason="this machine has a GPU driver")
def test_on_a_node_without_a_gpu_driver_worker_sh_runs_one_process_without_importing_torch_to_count_gpus(
        tmp_path: Path) -> None:
    """With no --nproc-per-node, a node runs one process per GPU torch sees. Without a GPU driver's device node
    torch sees none, so the node does not import torch only to count them; and worker.sh starts one interpreter
    for all the node does before its agent (and one that imports distqa alone, its check): here, every interpreter
    it starts is logged by a stand-in PYTHON, and each import by Python's own -X importtime
    (PYTHONPROFILEIMPORTTIME)."""
    calls = tmp_path / "calls"
    stand_in = tmp_path / "python"
    stand_in.write_text(f'#!/usr/bin/env bash\necho "$1 $2" >> {calls}\nexec {sys.executable} "$@"\n')
    stand_in.chmod(0o755)
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "worker.sh"), "--nnodes", "1", "--master-port", str(free_port()),
         "--run-id", "count", "--dry-run", "--", *MACHINERY_ARGS],
        cwd=REPO_ROOT, env=clean_env(PYTHON=str(stand_in), PYTHONPROFILEIMPORTTIME="1"), capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "worker.sh: run 'count': " in result.stderr and ", 1 process(es), " in result.stderr, result.stderr
    assert "--nproc-per-node 1 " in result.stdout, result.stdout
    assert calls.read_text().splitlines() == ["-c import distqa", "-m distqa.launch.node"]
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time")]
    assert "distqa.launch.node_options" in imported and "torch" not in imported, result.stderr[-2000:]
