"""The preflight doctor on two nodes through scripts/worker.sh that disagree (other code, a fork's task, other
configs, an invalid setting), named by rank 0, and training that refuses to start on such nodes."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

from support.doctor import failures
from support.processes import clean_env, free_port
from support.repo import MACHINERY_ARGS, REPO_ROOT


def doctor_on_two_nodes(common: list[str], node_1_cwd: Path = REPO_ROOT, node_1_env: dict[str, str] | None = None,
                        node_0_status: int = 1) -> list[subprocess.CompletedProcess[str]]:
    """``worker.sh`` (``--doctor`` in ``common``, or training) as node 0 (this checkout) and node 1 (``node_1_cwd``,
    with ``node_1_env`` added) on loopback; node 0 ends with ``node_0_status`` (the doctor's failed report: 1).
    Returns each node's outcome."""
    env = clean_env(NODE_ADDR="127.0.0.1", NODE_CORES="1", PYTHON=sys.executable)
    nodes = [
        subprocess.Popen(["bash", "scripts/worker.sh", "--node-rank", "0", *common], cwd=REPO_ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen(["bash", "scripts/worker.sh", "--node-rank", "1", "--master-addr", "127.0.0.1", *common],
                         cwd=node_1_cwd, env={**env, **(node_1_env or {})}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True),
    ]
    try:
        outputs = [subprocess.CompletedProcess(node.args, 0, *node.communicate(timeout=150)) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, output in zip(nodes, outputs, strict=True):
        output.returncode = node.returncode
    assert outputs[0].returncode == node_0_status, outputs[0].stdout + outputs[0].stderr
    return outputs


def stale_distqa(tmp_path: Path) -> Path:
    """A copy of the package with one changed line, as a node with a stale upload has; returns its src folder."""
    stale = tmp_path / "stale"
    shutil.copytree(REPO_ROOT / "src" / "distqa", stale / "src" / "distqa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with (stale / "src" / "distqa" / "training" / "trainer.py").open("a") as trainer:  # machinery every task runs
        trainer.write("# an edit that reached one node only\n")
    for shared in ("configs", "data"):  # the copy finds presets and the tiny model beside it, as a checkout
        (stale / shared).symlink_to(REPO_ROOT / shared)
    return stale / "src"


def test_two_nodes_with_other_code_and_config_are_named_by_rank_0(tmp_path: Path) -> None:
    """Two worker.sh agents on 127.0.0.1 (one rank each, c10d rendezvous): node 1 runs a copy of the
    package with one changed line and another learning rate, as a node with a stale upload and its own
    .env would."""
    stale = stale_distqa(tmp_path)
    port = str(free_port())
    common = ["--nnodes", "2", "--master-port", port, "--run-id", "doctor-test", "--nproc-per-node", "1",
              "--join-timeout", "60", "--doctor", "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path / "results"),
              "--allreduce-mb", "1", "--timeout-s", "60"]
    outputs = doctor_on_two_nodes(common, node_1_env={"PYTHONPATH": str(stale), "DISTQA_LR": "0.001"})
    master_out = outputs[0].stdout
    table = master_out.splitlines()[:3]
    assert [row.split()[0] for row in table] == ["rank", "0", "1"]
    code, config = (table[0].split().index(column) for column in ("code", "config"))
    assert table[1].split()[code] != table[2].split()[code] and table[1].split()[config] != table[2].split()[config]
    assert "all-reduce 1 MB float32 over 2 ranks (gloo):" in master_out and "bus bandwidth" in master_out
    found = failures(subprocess.CompletedProcess([], 1, master_out, ""))
    assert any("rank 1 (" in f and "runs other code" in f
               and "package distqa differs in distqa/training/trainer.py (changed)" in f for f in found), found
    assert any("rank 1 (" in f and "lr 0.0005 on rank 0, 0.001 here" in f for f in found), found
    assert len(found) == 2, found
    assert "FAIL" not in outputs[1].stdout, "only rank 0 prints the report"


def test_two_nodes_with_other_code_of_a_forks_task_are_named_by_rank_0(tmp_path: Path) -> None:
    """The code hash covers the task's own package: node 1 runs from a checkout whose copy of the example
    task (examples/, outside src/distqa) has one changed line; distqa itself is the same on both nodes."""
    stale = tmp_path / "stale"
    shutil.copytree(REPO_ROOT / "examples", stale / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "scripts", stale / "scripts")
    with (stale / "examples" / "text_classification" / "task.py").open("a") as task:
        task.write("# an edit that reached one node only\n")
    port = str(free_port())
    common = ["--nnodes", "2", "--master-port", port, "--run-id", "doctor-fork", "--nproc-per-node", "1",
              "--join-timeout", "60", "--doctor", "--", "--task",
              "examples.text_classification.task:TextClassification", "--output-dir", str(tmp_path / "results"),
              "--allreduce-mb", "1", "--timeout-s", "60"]
    master_out = doctor_on_two_nodes(common, node_1_cwd=stale)[0].stdout
    found = failures(subprocess.CompletedProcess([], 1, master_out, ""))
    assert len(found) == 1 and "rank 1 (" in found[0] and "runs other code than rank 0" in found[0], found
    # The package that differs (not distqa), its first changed file, where each node imports it from, and advice
    # for nodes on one host (the platform's image and upload would not help).
    said = ("package examples differs in examples/text_classification/task.py (changed), imported from "
            f"{stale / 'examples'} on rank 1, {REPO_ROOT / 'examples'} on rank 0; both run on this host")
    assert said in found[0], found
    assert "package distqa" not in found[0] and "neuro-flow" not in found[0], found


def test_training_on_a_node_with_other_code_stops_naming_the_file_with_exit_2_and_in_the_rank_logs(
        tmp_path: Path) -> None:
    """The preflight of a training run through worker.sh, node 1 with a stale copy of distqa: each node ends with
    the workers' exit 2 (not torchrun's 1) and no ChildFailedError traceback; the refusal names the package, its
    first changed file and where each node imports it from, and is in every rank's log file too."""
    stale = stale_distqa(tmp_path)
    common = ["--nnodes", "2", "--master-port", str(free_port()), "--run-id", "stale", "--nproc-per-node", "1",
              "--join-timeout", "60", "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path / "results"),
              "--max-steps", "2"]
    outputs = doctor_on_two_nodes(common, node_1_env={"PYTHONPATH": str(stale)}, node_0_status=2)
    run_dir = tmp_path / "results" / "stale"
    for node, output in enumerate(outputs):
        assert output.returncode == 2, output.stderr
        assert output.stderr.count("distqa.train: configuration error: the ranks of this run disagree:") == 1
        assert (f"rank 1 ({socket.gethostname()}) runs other code than rank 0 ({socket.gethostname()}): package distqa "
                f"differs in distqa/training/trainer.py (changed), imported from {stale / 'distqa'} on rank 1, "
                f"{REPO_ROOT / 'src' / 'distqa'} on rank 0; both run on this host") in output.stderr
        assert "Traceback" not in output.stderr and "ChildFailedError" not in output.stderr, output.stderr
        assert f"worker.sh: run 'stale' node {node}: the workers refused to run (exit 2); why is above and in " \
            f"{run_dir}/logs/rank-*.log" in output.stderr
        log = (run_dir / "logs" / f"rank-{node}.log").read_text()
        assert f"[rank {node}] ERROR distqa: distqa.train: configuration error: the ranks of this run disagree" in log
        assert "package distqa differs in distqa/training/trainer.py (changed)" in log
    assert not (run_dir / "checkpoints").exists()


OTHER_LR_ON_RANK_1 = """
import os, sys
if os.environ["RANK"] == "1":  # a node whose .env sets another learning rate
    os.environ["DISTQA_LR"] = "0.001"
from distqa.train import main
sys.exit(main())
"""


def test_training_refuses_to_start_when_ranks_resolved_other_configs(tmp_path: Path) -> None:
    """The cheap preflight of every training run: both ranks stop before the first step, with one line
    naming the setting, instead of training a different model on each rank."""
    script = tmp_path / "other_lr_on_rank_1.py"
    script.write_text(OTHER_LR_ON_RANK_1)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--max-steps", "2"],
                            cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT)),  # the task's
                            capture_output=True, text=True, timeout=180)  # package: a script's folder is sys.path[0]
    assert result.returncode != 0
    refusal = "distqa.train: configuration error: the ranks of this run disagree"
    assert result.stderr.count(refusal) == 2, result.stderr
    assert "rank 1 (" in result.stderr and "lr 0.0005 on rank 0, 0.001 here" in result.stderr
    assert "preflight.py" not in result.stderr, "no worker traceback (torchrun's own summary follows, as always)"
    assert not (tmp_path / "local" / "checkpoints").exists()


BAD_LR_ON_RANK_1 = """
import os, sys
if os.environ["RANK"] == "1":  # one node's .env holds a value no run accepts
    os.environ["DISTQA_LR"] = "-1"
from distqa.doctor import main
sys.exit(main())
"""


def test_a_rank_with_an_invalid_setting_still_reports_to_rank_0(tmp_path: Path) -> None:
    """Instead of exiting alone and leaving the other ranks in the process group until the timeout."""
    script = tmp_path / "bad_lr_on_rank_1.py"
    script.write_text(BAD_LR_ON_RANK_1)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(script), *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--allreduce-mb", "1",
                             "--timeout-s", "60"],
                            cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    rows = [row.split() for row in result.stdout.splitlines()[1:3]]
    assert [row[9] for row in rows] != ["invalid", "invalid"] and rows[1][9] == "invalid"
    found = failures(result)
    assert any(f.startswith("FAIL rank 1 (") and "configuration error: lr must be > 0, got -1.0" in f for f in found)
    assert any("rank 1 (" in f and "resolved another config than rank 0 (or none" in f for f in found), found
