"""The faults of an elastic node range (issue 34; the runs themselves: tests/distributed/test_elastic.py): a range
that does not split the global batch is refused before any rendezvous (by the check, worker.sh, every worker and the
doctor), and a minimum never reached ends with the 'never joined' line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config import ConfigError
from distqa.launch.elastic import NodeRange, check_node_range
from distqa.settings.sources import load_config

from conftest import MACHINERY_ARGS, REPO_ROOT, clean_env, free_port, node_in_process
from distributed.conftest import ELASTIC_TRAINER_ARGS as TRAINER_ARGS
from distributed.conftest import RENDEZVOUS, finish, node_output, start_node


def test_a_range_whose_world_sizes_do_not_split_the_global_batch_is_refused_in_one_line() -> None:
    config = load_config([*MACHINERY_ARGS, "--global-batch-size", "12", "--per-rank-batch-size", "2"], environ={})
    check_node_range(config, NodeRange(2, 3, 1))  # 12 = 2 × 2 × 3 = 2 × 3 × 2
    with pytest.raises(ConfigError) as refused:
        check_node_range(config, NodeRange(2, 4, 1))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("the node range 2:4 nodes × 1 process(es) = world sizes 2, 3, 4 does not split "
                              "global_batch_size 12 for world size 4: 12 % (2 × 4) = 4")
    assert "a multiple of 24" in message  # 2 × lcm(2, 3, 4)


def test_worker_sh_refuses_such_a_range_before_any_rendezvous(tmp_path: Path) -> None:
    """The node's check (distqa.launch.node, in this process: conftest.node_in_process)."""
    result = node_in_process(
        ["--nnodes", "4", "--min-nodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--dry-run", "--",
         *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--global-batch-size", "24", "--per-rank-batch-size", "2"],
        clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("worker.sh: configuration error: the node range 2:4 nodes × 2 process(es) = world sizes 4, 6, 8 does not "
            "split global_batch_size 24 for world size 8: 24 % (2 × 8) = 8") in result.stderr
    assert "e.g. 48" in result.stderr and "--nnodes" not in result.stdout


def test_every_worker_refuses_such_a_range_before_its_process_group(tmp_path: Path) -> None:
    """The trainer's own check (a worker started by another launcher than worker.sh, with the range exported)."""
    result = subprocess.run(
        [sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--global-batch-size",
         "12", "--per-rank-batch-size", "2"],
        cwd=REPO_ROOT, env=clean_env(WORKER_NODE_RANGE="2:4", OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "distqa.train: configuration error: the node range 2:4 nodes × 1 process(es) = world sizes 2, 3, 4 does " \
           "not split global_batch_size 12 for world size 4" in result.stderr
    assert not (tmp_path / "local" / "checkpoints").exists()


def test_a_minimum_never_reached_ends_with_the_never_joined_line(tmp_path: Path) -> None:
    """3 nodes, at least 2: only node 0 comes; at the join timeout its agent names the nodes that never joined."""
    node = start_node(0, 3, free_port(), "alone", tmp_path, "--min-nodes", "2", "--join-timeout", "3",
                      trainer_args=TRAINER_ARGS, **RENDEZVOUS)
    finish(node, timeout=120)
    output = node_output(tmp_path, "alone", 0).read_text()
    assert node.returncode == 4, output
    assert ("with 1 of 3 nodes (--node-rank 0..2, at least 2 to start) joined (node 0 at 127.0.0.1); node 1, 2 never "
            "joined") in output


@pytest.mark.parametrize(("batch", "exit_code"), [("12", 0), ("6", 1)])
def test_the_doctor_reports_the_range_and_fails_one_that_does_not_split_the_global_batch(
        tmp_path: Path, batch: str, exit_code: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "distqa.doctor", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
         "--global-batch-size", batch, "--per-rank-batch-size", "2"],
        cwd=REPO_ROOT, env=clean_env(WORKER_NODE_RANGE="2:3", OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == exit_code, result.stdout + result.stderr
    assert "nodes: 2:3 nodes × 1 process(es) = world sizes 2, 3, elastic" in result.stdout
    if exit_code:
        assert "FAIL the node range 2:3 nodes × 1 process(es) = world sizes 2, 3 does not split global_batch_size 6 " \
               "for world size 2: 6 % (2 × 2) = 2" in result.stdout
    else:
        assert "global batch 12 in accumulation steps 3 at 2, 2 at 3 ranks" in result.stdout
