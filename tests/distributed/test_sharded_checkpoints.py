"""Sharded checkpoints (``--checkpoint-format sharded``, distqa.checkpoint.sharded) in real runs: each rank writes its
own DCP shards in the background into ``step-N.dcp/``, and every promise of the single file holds for the directory.

Real runs of the machinery task (fp32, global batch 16, fsdp on 2 ranks with accumulation), started once for the
module (:func:`runs`): the uninterrupted run; a run ended at step 2 (``--stop-at-step``) and started again
(``--resume auto``); and the first run's step-2 directory resumed on 4 ranks and by DDP writing files. Faults on
many ranks (a full disk on rank 1, a kill of rank 0 mid-write): 2-rank jobs of tests/support/sharded_checkpoint_job.py.
What needs no peers (rotation, the deadline): tests/unit/test_sharded_checkpoints.py. A QA checkpoint written
sharded and exported, predicted and evaluated: tests/qa/test_sharded_checkpoints_qa.py."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distqa.checkpoint.format import MANIFEST, STATE_FILE, verify_directory
from distqa.checkpoint.run_folder import list_checkpoints, newest_intact_checkpoint, remove_stale_temporaries
from distqa.checkpoint.sharded import load_sharded, sharded_checkpoint_path

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import MACHINERY_ARGS, REPO_ROOT, reviews
from support.runs import run_training

STEPS = 4
SAME_STRATEGY = 1e-6
ACROSS = 1e-5
"""Another world size or strategy sums the same gradients in another order (tests/distributed/test_sharding.py)."""


def run_args(data: list[str], output_dir: Path, name: str, per_rank: int, *extra: str) -> list[str]:
    return [*MACHINERY_ARGS, *data, "--output-dir", str(output_dir), "--run-name", name, "--global-batch-size", "16",
            "--per-rank-batch-size", str(per_rank), "--max-steps", str(STEPS), "--checkpoint-every", "2",
            "--classifier-dropout", "0", "--lr", "5e-4", "--eval-every", "2", "--eval-batch-size", "4",
            "--dist-timeout-s", "60", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Run name -> (its run directory, its output)."""
    output_dir = tmp_path_factory.mktemp("sharded")
    data = reviews(output_dir, 85)
    outputs: dict[str, str] = {}

    def train(name: str, nproc: int, per_rank: int, *extra: str) -> None:
        result = run_training(run_args(data, output_dir, name, per_rank, *extra), nproc=nproc)
        outputs[name] = outputs.get(name, "") + result.stdout + result.stderr

    sharded = ("--data-parallel", "fsdp", "--checkpoint-format", "sharded")
    train("fsdp", 2, 4, *sharded)
    step_2 = str(sharded_checkpoint_path(output_dir / "fsdp", 2))
    train("resumed", 2, 4, *sharded, "--stop-at-step", "2")  # ends with its step-2 directory
    train("resumed", 2, 4, *sharded)  # --resume auto: the newest intact checkpoint, that directory
    train("four_ranks", 4, 4, *sharded, "--resume", step_2)
    train("ddp", 2, 4, "--data-parallel", "ddp", "--checkpoint-format", "file", "--resume", step_2)
    return {name: (output_dir / name, output) for name, output in outputs.items()}


def sharded_weights(run_dir: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_sharded(sharded_checkpoint_path(run_dir, step)).model


def test_each_rank_writes_its_shards_in_the_background_with_a_manifest_written_last(
        runs: dict[str, tuple[Path, str]]) -> None:
    """A sharded run's step checkpoints are directories: each rank's .distcp file, DCP's .metadata, rank 0's
    state.pt and the manifest of them all (which verifies); best.pt stays one file; written in the background, and
    the first write went through the graceful stop's deadline check."""
    run_dir, output = runs["fsdp"]
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002.dcp", "step-00000004.dcp"]
    assert not list((run_dir / "checkpoints").glob("step-*.pt")) and (run_dir / "checkpoints" / "best.pt").is_file()
    directory = sharded_checkpoint_path(run_dir, STEPS)
    manifest = json.loads((directory / MANIFEST).read_text())["files"]
    assert sorted(manifest) == [".metadata", "__0_0.distcp", "__1_0.distcp", STATE_FILE]
    assert sorted(p.name for p in directory.iterdir()) == sorted([*manifest, MANIFEST])
    verify_directory(directory)
    state = torch.load(directory / STATE_FILE, weights_only=True)
    assert state["progress"]["step"] == STEPS and state["world_size"] == 2 and len(state["rng"]) == 2
    assert state["model"] == {} and state["optimizer"] == {}  # the weights are in the shards only
    assert f"saved checkpoint {directory} (" in output and "from 2 rank(s)" in output and "in the background" in output
    assert "checkpoint write: step-00000002.dcp is" in output  # the deadline check, once, on the first write
    assert "checkpoint write: step-00000004.dcp" not in output


def test_a_sharded_checkpoint_resumes_exactly_on_as_many_ranks(runs: dict[str, tuple[Path, str]]) -> None:
    """A fsdp run ended at step 2 and started again (--resume auto: its newest intact checkpoint, the step-2
    directory) ends with the uninterrupted run's weights and Adam moments (1e-6)."""
    run_dir, output = runs["resumed"]
    assert f"resumed from {sharded_checkpoint_path(run_dir, 2)} at step 2" in output
    difference = max_difference(sharded_weights(runs["resumed"][0]), sharded_weights(runs["fsdp"][0]))
    assert difference < SAME_STRATEGY, difference
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    moments = [_load_state_dict_from_keys({"optimizer"}, checkpoint_id=str(sharded_checkpoint_path(runs[name][0],
                                                                                                   STEPS)))
               for name in ("resumed", "fsdp")]
    for name, state in moments[1]["optimizer"]["state"].items():
        torch.testing.assert_close(moments[0]["optimizer"]["state"][name]["exp_avg"], state["exp_avg"],
                                   rtol=1e-4, atol=1e-8)


def test_a_sharded_checkpoint_resumes_on_four_ranks_and_in_a_ddp_run(runs: dict[str, tuple[Path, str]]) -> None:
    """The directory 2 ranks wrote resumes on 4 (DCP reshards; dropout reseeded, said once per rank) and in a DDP run
    writing files; both end with the uninterrupted run's weights (1e-5)."""
    reference = sharded_weights(runs["fsdp"][0])
    four_ranks, output = runs["four_ranks"]
    assert output.count("checkpoint came from world size 2, now 4") == 4
    assert max_difference(sharded_weights(four_ranks), reference) < ACROSS
    ddp, output = runs["ddp"]
    assert "step-00000002.dcp at step 2" in output and (ddp / "checkpoints" / f"step-{STEPS:08d}.pt").is_file()
    assert max_difference(final_weights(ddp), reference) < ACROSS


def test_damaged_shards_are_detected_before_a_resume_uses_them(runs: dict[str, tuple[Path, str]], tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A flipped byte in a shard of the newest directory: the resume's choice skips it in one line, renames it
    *.corrupt and takes the one before; a truncated shard is named by its size, before any CRC is computed."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["fsdp"][0], run_dir)
    shard = sharded_checkpoint_path(run_dir, STEPS) / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="distqa.checkpoint.format"):
        found = newest_intact_checkpoint(run_dir)
    assert found is not None and found.path == sharded_checkpoint_path(run_dir, 2)
    assert found.checkpoint.progress.step == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"skipping a damaged checkpoint: {shard} is corrupted: CRC-32 ")
    assert "Renamed it step-00000004.dcp.corrupt" in said[0]
    assert (run_dir / "checkpoints" / "step-00000004.dcp.corrupt").is_dir()
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002.dcp"]
    previous = sharded_checkpoint_path(run_dir, 2) / "__0_0.distcp"
    with open(previous, "r+b") as f:
        f.truncate(previous.stat().st_size - 1)
    assert newest_intact_checkpoint(run_dir) is None
    said = caplog.records[-1].getMessage()
    assert "truncated or damaged" in said and str(previous) in said


def run_job(scenario: str, run_dir: Path) -> list[subprocess.CompletedProcess[str]]:
    """tests/support/sharded_checkpoint_job.py on 2 ranks (two processes, a gloo group)."""
    env = clean_env(OMP_NUM_THREADS="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ranks = [subprocess.Popen([sys.executable, str(REPO_ROOT / "tests" / "support" / "sharded_checkpoint_job.py"),
                               scenario, str(run_dir)], env={**env, "RANK": str(rank)}, cwd=REPO_ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in (0, 1)]
    done = []
    for rank in ranks:
        stdout, stderr = rank.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(rank.args, rank.returncode, stdout, stderr))
    return done


def outcomes(ranks: list[subprocess.CompletedProcess[str]]) -> list[str | None]:
    lines = [[line for line in rank.stdout.splitlines() if line.startswith("{")] for rank in ranks]
    return [json.loads(found[-1])["outcome"] if found else None for found in lines]


def test_a_full_disk_on_one_rank_fails_the_write_on_every_rank_and_leaves_the_previous_checkpoint(
        tmp_path: Path) -> None:
    """Rank 1's shard write of step 4 runs out of space: both ranks raise DiskFullError naming rank 1, the temporary
    is removed, and step 2 is still the newest intact checkpoint."""
    ranks = run_job("full-disk", tmp_path)
    assert [rank.returncode for rank in ranks] == [0, 0], [rank.stderr for rank in ranks]
    said = outcomes(ranks)
    assert all(outcome is not None and outcome.startswith("DiskFullError: no space left in ")
               and "while rank 1 wrote its shards of .step-00000004.dcp.tmp" in outcome for outcome in said), said
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002.dcp"]
    found = newest_intact_checkpoint(tmp_path)
    assert found is not None and found.checkpoint.progress.step == 2


def test_a_kill_during_the_write_leaves_the_previous_checkpoint_in_use(tmp_path: Path) -> None:
    """Rank 0 is SIGKILLed while writing step 4's manifest, every shard written: step 4 is no checkpoint (only a
    temporary, which the next start removes), step 2 is the one a resume takes."""
    ranks = run_job("kill", tmp_path)
    assert ranks[0].returncode == -9 and outcomes(ranks) == [None, "written"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002.dcp"]
    found = newest_intact_checkpoint(tmp_path)
    assert found is not None and found.checkpoint.progress.step == 2
    assert [p.name for p in remove_stale_temporaries(tmp_path)] == [".step-00000004.dcp.tmp"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002.dcp"]
