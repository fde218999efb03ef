"""Sharded data parallelism (``--data-parallel fsdp | hsdp``, distqa.distributed.fsdp) in real runs: the same model as
DDP.

Real runs of the machinery task, fp32, the same global batch of 16 with accumulation (2 micro-batches per rank) and
clipping on: DDP and FSDP on 2 ranks, HSDP on 2 emulated nodes × 2 processes (the local launcher, ``--min-nodes 1``)
that loses node 1 after step 3 and ends on node 0's 2 processes, then runs that resume the step-2 checkpoints of the
first two, in the same and in the other strategy. Every run is started once for the module (:func:`runs`) and each
test reads several claims off them. Its 17 validation texts split unevenly over the ranks, so each rank's evaluator
calls the model a different number of times (a sharded forward is a collective: the evaluation runs on gathered
weights); the evaluation at step 2 is followed by training (resharded weights). The QA model sharded per transformer
layer: tests/qa/test_sharding_qa.py."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from distqa.checkpoint.format import MANIFEST, STATE_FILE, verify_directory
from distqa.checkpoint.run_folder import list_checkpoints
from distqa.checkpoint.sharded import sharded_checkpoint_path

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import REPO_ROOT, reviews
from support.runs import RENDEZVOUS, run_training
from support.shared_runs import SHARDING_MAX_GRAD_NORM as MAX_GRAD_NORM
from support.shared_runs import SHARDING_STEPS as STEPS
from support.shared_runs import sharding_run_args as run_args

ACROSS_STRATEGIES = 1e-5
"""DDP against a sharded run: they sum the same gradients in another order (all-reduce against reduce-scatter, the
clipping norm from per-shard partial norms), which differs in float rounding by ~1e-7 after a few steps."""
SAME_STRATEGY = 1e-6
NODE_LOST = "kill-node:rank=3:step=3"
"""Node 1's agent and rank 3 SIGKILLed after step 3, of 4; no checkpoint is due before step 4 (checkpoint_every 40 in
the hsdp run): only the survivors' save can resume it at step 3. Rank 2, whose agent is gone, lives on without its
replica's other half."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Run name -> (its run directory, its output). 85 reviews: 68 training texts (4 steps, one epoch), 17 to
    validate."""
    output_dir = tmp_path_factory.mktemp("sharding")
    data = reviews(output_dir, 85)
    outputs: dict[str, str] = {}

    def train(name: str, *extra: str) -> None:
        result = run_training(run_args(data, output_dir, name, 4, *extra), nproc=2)
        outputs[name] = result.stdout + result.stderr

    train("ddp", "--data-parallel", "ddp")
    train("fsdp", "--data-parallel", "fsdp")
    hsdp_args = run_args(data, output_dir, "hsdp", 2, "--data-parallel", "hsdp")
    hsdp_args[hsdp_args.index("--checkpoint-every") + 1] = str(10 * STEPS)
    hsdp = subprocess.run(
        ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--procs-per-node", "2", "--min-nodes", "1",
         "--max-restarts", "1", "--port", str(free_port()), "--run-id", "hsdp", "--", *hsdp_args],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", INJECT_FAULT=NODE_LOST,
                                     RDZV_JOIN_TIMEOUT="60", **RENDEZVOUS),
        capture_output=True, text=True, timeout=300)
    assert hsdp.returncode == 0, hsdp.stdout + hsdp.stderr
    outputs["hsdp"] = hsdp.stdout + hsdp.stderr
    step_2 = "checkpoints/step-00000002.pt"
    train("fsdp_resumed", "--data-parallel", "fsdp", "--resume", str(output_dir / "fsdp" / step_2))
    train("ddp_to_fsdp", "--data-parallel", "fsdp", "--resume", str(output_dir / "ddp" / step_2))
    train("fsdp_to_ddp", "--data-parallel", "ddp", "--resume", str(output_dir / "fsdp" / step_2))
    return {name: (output_dir / name, output) for name, output in outputs.items()}


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / f"step-{STEPS:08d}.pt", map_location="cpu", weights_only=True)


def test_fsdp_and_hsdp_end_with_the_weights_of_ddp_in_its_checkpoint_layout(runs: dict[str, tuple[Path, str]]) -> None:
    """fsdp on 2 ranks and hsdp on 2 nodes × 2 processes (then node 0's 2, after the loss of node 1) end with DDP's
    weights and Adam moments (a running mean of the gradients: a gradient summed instead of averaged would show there)
    to 1e-5, with clipping active; their checkpoints hold the same keys, optimizer numbering, groups and shapes as
    DDP's; every log's start line names its data parallelism, and every rank evaluated (unequal shares, no hang) with
    the same result."""
    reference = last_checkpoint(runs["ddp"][0])
    norms = [float(n) for n in re.findall(r"grad norm ([0-9.]+)", runs["ddp"][1])]
    assert len(norms) == STEPS and max(norms) > MAX_GRAD_NORM, f"clipping never engaged: {norms}"
    for name in ("fsdp", "hsdp"):
        checkpoint = last_checkpoint(runs[name][0])
        assert checkpoint.keys() == reference.keys()
        assert max_difference(checkpoint["model"], reference["model"]) < ACROSS_STRATEGIES, name
        assert checkpoint["optimizer"]["param_groups"] == reference["optimizer"]["param_groups"]
        assert checkpoint["optimizer"]["state"].keys() == reference["optimizer"]["state"].keys()
        for index, state in reference["optimizer"]["state"].items():
            for key, value in state.items():
                torch.testing.assert_close(checkpoint["optimizer"]["state"][index][key], value, rtol=1e-4,
                                           atol=1e-8, msg=lambda m, name=name, key=key: f"{name} {key}: {m}")
        evaluation, expected = checkpoint["evaluation"], reference["evaluation"]
        assert evaluation["texts"] == expected["texts"] == 17 and evaluation["accuracy"] == expected["accuracy"]
        assert abs(evaluation["loss"] - expected["loss"]) < ACROSS_STRATEGIES
    for name, worlds in (("ddp", [2, 2]), ("fsdp", [2, 2]), ("hsdp", [2, 2, 4, 4, 4, 4])):  # hsdp: 4, then 2 ranks
        starts = re.findall(r"rank \d of (\d) \(node \d, local rank \d\) on cpu with gloo, data parallel (\w+);",
                            runs[name][1])
        assert sorted(starts) == [(str(world), name) for world in worlds], starts
    assert "hsdp: 2 sharding units (Embedding, Linear) over a mesh of 2 × 2 ranks" in runs["hsdp"][1]
    assert "hsdp: 2 sharding units (Embedding, Linear) over a mesh of 1 × 2 ranks" in runs["hsdp"][1]


def test_a_whole_hsdp_replica_that_survives_a_lost_node_saves_the_step_it_holds(
        runs: dict[str, tuple[Path, str]]) -> None:
    """Node 1 lost after step 3 (NODE_LOST), no checkpoint written before: node 0's two ranks, a whole replica, save
    step 3 together as a sharded checkpoint with a gloo group of their own (the default group is broken), each chunk of
    the model and optimizer state once, and say so in one line each; rank 2, whose replica lost rank 3, saves nothing
    and says why; no traceback. The run goes on with node 0 alone from step 3 (DCP reads the shards of the 2 × 2 mesh
    into the 1 × 2 one) and ends with DDP's weights (the test above)."""
    run_dir, output = runs["hsdp"]
    said = sorted(re.findall(r"distqa\.train: (rank \d: .*)", output))
    assert [line.split(":")[0] for line in said] == ["rank 0", "rank 1", "rank 2"], output
    assert all(line.startswith(f"rank {rank}: lost a peer during ") and " after optimizer step 3 (gloo: connection "
               in line for rank, line in enumerate(said[:2])), said
    assert [line.rsplit("; ", 1)[1] for line in said[:2]] == \
        ["saved step 3 for the resume with its replica group (ranks 0, 1)"] * 2
    assert re.search(r"; its replica group \(ranks 2, 3\) lost a rank too \(gloo: [^)]+\): the resume goes back to "
                     "the newest checkpoint$", said[2]), said[2]
    assert "Traceback" not in output, output
    assert "node 1 exited with status 137; the other 1 node(s) go on (--min-nodes 1)" in output
    assert re.findall(r"membership: round \d+: (\d) node\(s\) .*, world size (\d)", output) == [("2", "4"), ("1", "2")]

    directory = sharded_checkpoint_path(run_dir, 3)
    assert [p.name for p in list_checkpoints(run_dir)] == [directory.name, f"step-{STEPS:08d}.pt"]
    assert output.count(f"resumed from {directory} at step 3 (epoch 0, 48 examples into it") == 2
    verify_directory(directory)
    assert sorted(json.loads((directory / MANIFEST).read_text())["files"]) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp", STATE_FILE]
    state = torch.load(directory / STATE_FILE, weights_only=True)
    assert state["progress"]["step"] == 3 and state["saved_by_rank"] == 0 and state["rng"] == [None] * 4
    # Each chunk once: the chunks of every tensor tile it (DCP's planner refuses overlaps and gaps), each in one of the
    # two files, and the embedding's rows are split between the two ranks (sharded, not written whole by one).
    metadata = FileSystemReader(str(directory)).read_metadata()
    tensors = {key: value for key, value in metadata.state_dict_metadata.items()
               if isinstance(value, TensorStorageMetadata)}
    for key, tensor in tensors.items():
        assert sum(math.prod(chunk.sizes) for chunk in tensor.chunks) == math.prod(tensor.size), key
        assert len({tuple(chunk.offsets) for chunk in tensor.chunks}) == len(tensor.chunks), key
    assert len(tensors["model.embedding.weight"].chunks) == 2
    assert {item.relative_path for item in metadata.storage_data.values()} == {"__0_0.distcp", "__1_0.distcp"}


def test_a_sharded_run_resumes_exactly_and_across_strategies(runs: dict[str, tuple[Path, str]]) -> None:
    """From the step-2 checkpoints to step 4: fsdp from its own ends where the uninterrupted fsdp run ended (1e-6:
    the same arithmetic); DDP's checkpoint resumed with fsdp ends with DDP's weights, and fsdp's resumed with DDP
    with fsdp's (1e-5, ACROSS_STRATEGIES: the continuation sums in the other strategy's order)."""
    for resumed, uninterrupted, tolerance in (("fsdp_resumed", "fsdp", SAME_STRATEGY),
                                              ("ddp_to_fsdp", "ddp", ACROSS_STRATEGIES),
                                              ("fsdp_to_ddp", "fsdp", ACROSS_STRATEGIES)):
        assert "resumed from" in runs[resumed][1] and "at step 2" in runs[resumed][1]
        difference = max_difference(final_weights(runs[resumed][0]), final_weights(runs[uninterrupted][0]))
        assert difference < tolerance, f"{resumed} differs from {uninterrupted} by {difference:.2e}"
        moments = last_checkpoint(runs[resumed][0])["optimizer"]["state"]
        for index, state in last_checkpoint(runs[uninterrupted][0])["optimizer"]["state"].items():
            torch.testing.assert_close(moments[index]["exp_avg"], state["exp_avg"], rtol=1e-4, atol=1e-8)
