"""The faults of an elastic node range (issue 34; the runs themselves: tests/distributed/test_elastic.py): any range
trains the same global batch in uneven shares (issue 61), but one whose largest world size exceeds the global batch is
refused before any rendezvous (by the check, worker.sh, every worker and the doctor), and a minimum never reached ends
with the 'never joined' line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distqa.config import ConfigError
from distqa.config.sources import load_config
from distqa.distributed.elastic import NodeRange, check_node_range, membership_line, range_report, split_line

from support.processes import clean_env, free_port, node_in_process
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import RENDEZVOUS, finish, node_output, start_node
from support.shared_runs import ELASTIC_TRAINER_ARGS as TRAINER_ARGS


def test_a_range_that_does_not_divide_the_global_batch_is_accepted_and_one_beyond_it_refused_in_one_line() -> None:
    config = load_config([*MACHINERY_ARGS, "--global-batch-size", "12", "--per-rank-batch-size", "2"], environ={})
    check_node_range(config, NodeRange(2, 3, 1))  # 12 = 2 × 2 × 3 = 2 × 3 × 2
    check_node_range(config, NodeRange(5, 12, 1))  # 12 over 5, 7, 8, …: shares that differ by one
    check_node_range(config, NodeRange(1, 6, 2))  # up to 6 nodes × 2 processes = 12 ranks
    with pytest.raises(ConfigError) as refused:
        check_node_range(config, NodeRange(10, 14, 1))
    message = str(refused.value)
    assert message == ("the node range 10:14 nodes × 1 process(es) = world sizes 10, 11, 12, 13, 14 exceeds "
                       "global_batch_size 12 at world size 13, 14: some ranks would have no example to train on; use "
                       "a global_batch_size of at least 14, or a --nnodes of at most 12.")
    grow = load_config([*MACHINERY_ARGS, "--global-batch-size", "12", "--per-rank-batch-size", "2",
                        "--grow-global-batch", "true"], environ={})
    with pytest.raises(ConfigError, match=r"to train on \(grow_global_batch does not apply over a range: the "
                                          r"batch would change with the membership\); use a global_batch_size of at "
                                          r"least 16"):
        check_node_range(grow, NodeRange(4, 8, 2))


def test_the_split_at_each_world_size_is_one_line() -> None:
    config = load_config([*MACHINERY_ARGS, "--global-batch-size", "32", "--per-rank-batch-size", "4"], environ={})
    assert split_line(config, 3) == "global batch 32 = shares of 11/10 per rank × 3 ranks, 3 micro-batches of 4"
    assert split_line(config, 8) == "global batch 32 = shares of 4 per rank × 8 ranks, 1 micro-batch of 4"
    line, problems = range_report(config, NodeRange(2, 3, 1))
    assert problems == []
    assert line == ("nodes: 2:3 nodes × 1 process(es) = world sizes 2, 3, elastic: at 2: global batch 32 = shares of "
                    "16 per rank × 2 ranks, 4 micro-batches of 4; at 3: global batch 32 = shares of 11/10 per rank × 3 "
                    "ranks, 3 micro-batches of 4")
    assert membership_line("4", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], config, 3) == (
        "membership: round 4: 3 node(s) (10.0.0.1, 10.0.0.2, 10.0.0.3), world size 3, global batch 32 = shares of "
        "11/10 per rank × 3 ranks, 3 micro-batches of 4")


def test_worker_sh_refuses_a_range_beyond_the_global_batch_before_any_rendezvous(tmp_path: Path) -> None:
    """The node's check (distqa.launch.node, in this process: support.processes.node_in_process)."""
    result = node_in_process(
        ["--nnodes", "4", "--min-nodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--dry-run", "--",
         *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--global-batch-size", "6", "--per-rank-batch-size", "2"],
        clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("worker.sh: configuration error: the node range 2:4 nodes × 2 process(es) = world sizes 4, 6, 8 exceeds "
            "global_batch_size 6 at world size 8: some ranks would have no example to train on; use a "
            "global_batch_size of at least 8, or a --nnodes of at most 3.") in result.stderr
    assert "--nnodes" not in result.stdout


def test_every_worker_refuses_such_a_range_before_its_process_group(tmp_path: Path) -> None:
    """The trainer's own check (a worker started by another launcher than worker.sh, with the range exported)."""
    result = subprocess.run(
        [sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--output-dir", str(tmp_path), "--global-batch-size",
         "3", "--per-rank-batch-size", "1"],
        cwd=REPO_ROOT, env=clean_env(WORKER_NODE_RANGE="2:4", OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "distqa.train: configuration error: the node range 2:4 nodes × 1 process(es) = world sizes 2, 3, 4 " \
           "exceeds global_batch_size 3 at world size 4" in result.stderr
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


@pytest.mark.parametrize(("batch", "exit_code"), [("5", 0), ("2", 1)])
def test_the_doctor_reports_each_world_sizes_shares_and_fails_a_range_beyond_the_global_batch(
        tmp_path: Path, batch: str, exit_code: int) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "distqa.doctor", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
         "--global-batch-size", batch, "--per-rank-batch-size", "2"],
        cwd=REPO_ROOT, env=clean_env(WORKER_NODE_RANGE="2:3", OMP_NUM_THREADS="1"), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == exit_code, result.stdout + result.stderr
    assert "nodes: 2:3 nodes × 1 process(es) = world sizes 2, 3, elastic" in result.stdout
    if exit_code:
        assert "FAIL the node range 2:3 nodes × 1 process(es) = world sizes 2, 3 exceeds global_batch_size 2 at " \
               "world size 3: some ranks would have no example to train on" in result.stdout
    else:  # 5 over 2 or 3 ranks: 3/2 in 2 micro-batches of 2, 2/1 in 1
        assert "at 2: global batch 5 = shares of 3/2 per rank × 2 ranks, 2 micro-batches of 2; at 3: global batch " \
               "5 = shares of 2/1 per rank × 3 ranks, 1 micro-batch of 2" in result.stdout
