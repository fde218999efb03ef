"""scripts/train_slurm.sbatch's own checks, which start no run (the runs through real Slurm 22.05: a cluster of
containers, tests/docker/test_slurm_cluster.py, docs/SLURM.md)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from support.processes import clean_env
from support.repo import REPO_ROOT

# `scontrol show hostnames LIST` as Slurm 22.05's (slurm-client, scontrol.c: hostlist_create then one
# hostlist_shift a line): one host a line, and for an empty list nothing with status 0, which is what the script
# sees under an empty SLURM_JOB_NODELIST (tests/docker/test_slurm_cluster.py runs the same case with the real one).
# The script uses no other scontrol command.
FAKE_SCONTROL = """#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] || { echo "fake scontrol: unsupported: $*" >&2; exit 1; }
[[ -z "$3" ]] && exit 0
echo node1
echo node2
"""


def test_sbatch_script_without_hosts_says_so(tmp_path: Path) -> None:
    (tmp_path / "scontrol").write_text(FAKE_SCONTROL)
    (tmp_path / "scontrol").chmod(stat.S_IRWXU)
    env = clean_env(PATH=f"{tmp_path}:{os.environ['PATH']}",
                    SLURM_JOB_NODELIST="", SLURM_JOB_ID="1", SLURM_JOB_NUM_NODES="2")
    result = subprocess.run(["bash", "scripts/train_slurm.sbatch"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stderr == "distqa: scontrol listed no hosts for SLURM_JOB_NODELIST=''; run this under sbatch\n"


def test_the_batch_script_starts_every_node_through_worker_sh() -> None:
    """The Slurm batch script starts each node with scripts/worker.sh, as every launcher does
    (tests/launchers/test_launchers.py)."""
    text = (REPO_ROOT / "scripts/train_slurm.sbatch").read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "scripts/worker.sh" in "\n".join(code)


def test_the_batch_script_stops_through_its_shell_not_every_process() -> None:
    """The time limit's signal goes to the batch shell alone (B:), which sends one SIGTERM per node's worker.sh:
    Slurm's signal to a step reaches every process of it, and a worker's second signal ends it without its
    checkpoint (docs/SLURM.md; the run: tests/docker/test_slurm_cluster.py)."""
    lines = (REPO_ROOT / "scripts/train_slurm.sbatch").read_text().splitlines()
    assert [line for line in lines if line.startswith("#SBATCH --signal")] == ["#SBATCH --signal=B:TERM@120"]
    assert "trap stop_nodes TERM" in lines
