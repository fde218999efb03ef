"""scripts/train_slurm.sbatch with stand-ins for `srun` and `scontrol`: a real 2-node run on loopback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from distqa.launch.reachability import probe

from conftest import MACHINERY_ARGS, REPO_ROOT, clean_env, free_port
from distributed.conftest import final_weights

# `srun --kill-on-bad-exit=1 --ntasks-per-node=1 CMD...`: one task per node, as Slurm would start
# them (SLURM_NODEID set per task); when one task fails the others are killed, like --kill-on-bad-exit.
FAKE_SRUN = """#!/usr/bin/env bash
set -euo pipefail
while [[ "$1" == --* ]]; do shift; done
pids=()
for (( node = 0; node < SLURM_JOB_NUM_NODES; node++ )); do
    SLURM_NODEID=$node "$@" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    wait -n || { status=$?; kill "${pids[@]}" 2>/dev/null || true; }
done
exit "$status"
"""
# The pause between hosts is what a long node list does to a reader that stops after the first
# line: under pipefail, `scontrol ... | head -n 1` then dies of SIGPIPE (exit 141) every time.
FAKE_SCONTROL = """#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] || { echo "fake scontrol: unsupported: $*" >&2; exit 1; }
[[ "$3" == "none" ]] && exit 0
echo 127.0.0.1
sleep 0.3
echo 127.0.0.2
"""


def standins(directory: Path) -> Path:
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        path = directory / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return directory


def two_node_allocation(tmp_path: Path, job_id: str) -> dict[str, str]:
    """The environment sbatch gives the script for a 2-node allocation, with srun/scontrol stand-ins first on PATH."""
    return clean_env(
        PATH=f"{standins(tmp_path)}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        SLURM_JOB_NODELIST="node[1-2]", SLURM_JOB_ID=job_id, SLURM_JOB_NUM_NODES="2",
        MASTER_PORT=str(free_port()), NODE_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
        PYTHON=sys.executable)


def test_sbatch_script_trains_two_nodes(tmp_path: Path) -> None:
    env = two_node_allocation(tmp_path, "4242")
    result = subprocess.run(
        ["bash", "scripts/train_slurm.sbatch", "--", *MACHINERY_ARGS, "--max-steps", "3",
         "--output-dir", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "master 127.0.0.1:" in result.stderr and "run id slurm-4242" in result.stderr
    assert final_weights(tmp_path / "results" / "slurm-4242")
    assert "rank 1 of 2" in (tmp_path / "results" / "slurm-4242" / "logs" / "rank-1.log").read_text()


def test_sbatch_script_runs_the_doctor_on_every_node(tmp_path: Path) -> None:
    """What docs/FAULT_TOLERANCE.md asks for before a long job: the same allocation and arguments, with --doctor."""
    env = two_node_allocation(tmp_path, "4243")
    result = subprocess.run(
        ["bash", "scripts/train_slurm.sbatch", "--doctor", "--", *MACHINERY_ARGS, "--output-dir",
         str(tmp_path / "results"), "--allreduce-mb", "1", "--expect-world-size", "2"], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [row.split()[:2] for row in result.stdout.splitlines()[1:3]] == [["0", "0"], ["1", "1"]]
    assert "all-reduce 1 MB float32 over 2 ranks (gloo)" in result.stdout
    assert "doctor: all checks passed on 2 rank(s)" in result.stdout
    assert not (tmp_path / "results" / "slurm-4243" / "checkpoints").exists(), "the doctor trains nothing"


def test_sbatch_script_without_hosts_says_so(tmp_path: Path) -> None:
    env = clean_env(PATH=f"{standins(tmp_path)}:{os.environ['PATH']}",
                    SLURM_JOB_NODELIST="none", SLURM_JOB_ID="1", SLURM_JOB_NUM_NODES="2")
    result = subprocess.run(["bash", "scripts/train_slurm.sbatch"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "scontrol listed no hosts for SLURM_JOB_NODELIST='none'" in result.stderr


def test_the_sbatch_script_starts_a_forks_entry_module_on_every_node(tmp_path: Path) -> None:
    """`sbatch scripts/train_slurm.sbatch --entry-module M -- ARGS`: worker.sh runs `python -m M` on each node with
    the run's name and ARGS, as it runs the trainer."""
    (tmp_path / "forkentry.py").write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "Path(sys.argv[-1], f\"rank-{os.environ['RANK']}\").write_text(' '.join(sys.argv[1:]))\n")
    out = tmp_path / "out"
    out.mkdir()
    command = ["bash", "scripts/train_slurm.sbatch", "--entry-module", "forkentry", "--", "--my-flag", "1", str(out)]
    env = {**two_node_allocation(tmp_path, "77"), "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        f"rank-{rank}": f"--run-name slurm-77 --my-flag 1 {out}" for rank in (0, 1)}


def test_sbatch_script_with_external_store_trains_two_nodes_through_a_store_on_the_batch_host(tmp_path: Path) -> None:
    """EXTERNAL_STORE=1: the store starts on the batch host (SLURMD_NODENAME, as Slurm names the node running the
    script) before srun, every task is its client (node 0 too: worker.sh --external-store), and it is stopped when
    the script ends."""
    env = {**two_node_allocation(tmp_path, "4244"), "EXTERNAL_STORE": "1", "SLURMD_NODENAME": "127.0.0.1"}
    port = env["MASTER_PORT"]
    result = subprocess.run(
        ["bash", "scripts/train_slurm.sbatch", "--", *MACHINERY_ARGS, "--max-steps", "3",
         "--output-dir", str(tmp_path / "results")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"rendezvous store on the batch host 127.0.0.1:{port}" in result.stderr
    assert f"serving the rendezvous store on 0.0.0.0:{port}" in result.stdout
    assert output.count(f"rendezvous 127.0.0.1:{port} (an external store)") == 2, output
    assert "stopped on signal" in result.stdout  # the script's trap ended it: nothing listens on the port any more
    assert probe("127.0.0.1", int(port)) == "refused"
    assert final_weights(tmp_path / "results" / "slurm-4244")


def test_the_batch_script_starts_every_node_through_worker_sh() -> None:
    """The Slurm batch script starts each node with scripts/worker.sh, as every launcher does
    (tests/launchers/test_launchers.py)."""
    text = (REPO_ROOT / "scripts/train_slurm.sbatch").read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert "scripts/worker.sh" in "\n".join(code)
