"""The runs several test files compare against, made once per test session whichever pytest-xdist workers ask
(:func:`once_per_session`): the uninterrupted runs keyed by their training arguments (:func:`reference_run`), and the
arguments of the elastic, interrupted and sharded runs that share them."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from support.repo import MACHINERY_ARGS, reviews
from support.runs import run_training


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     produce: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """``produce(folder)``'s record (JSON), made once per session under ``<session>/<name>/`` however many xdist
    workers ask; the folder and the record."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder either way
    folder, record = shared / name, shared / name / "record.json"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            folder.mkdir(exist_ok=True)
            record.write_text(json.dumps(produce(folder)))
    return folder, json.loads(record.read_text())


# The elastic runs (tests/distributed/test_elastic.py, tests/distributed/test_rendezvous_store.py). 12 examples per
# step: 2 per rank × 3 ranks × 2 micro-batches, or × 2 ranks × 3. Dropout off: the weights of a run that changed its
# world size equal the uninterrupted run's (dropout masks are drawn per rank).
ELASTIC_TRAINER_ARGS = ("--max-steps", "14", "--checkpoint-every", "4", "--global-batch-size", "12",
                        "--per-rank-batch-size", "2", "--classifier-dropout", "0", "--stop-check-every", "1")




# One restart: the lost node and its return are membership changes, which spend none (distqa.launch.agent gives back
# the restart its survivors' exit 76 cost, distqa.training.peer_loss), so a run that lost a node and got it back still
# has it.
ELASTIC_NODE_ARGS = ("--min-nodes", "2", "--max-restarts", "1", "--join-timeout", "60")


def reference_run(tmp_path_factory: pytest.TempPathFactory, args: Sequence[str], nproc: int) -> Path:
    """The run directory of an uninterrupted run of the machinery task with the training arguments ``args`` (no
    --output-dir or --run-name) on ``nproc`` ranks (:func:`run_training`): made once per session and keyed by its
    arguments, so every test that compares a run it interrupted with the same training shares it, whichever file and
    worker asks first. The others wait for it; a test that starts its own runs first has them train beside it."""
    key = hashlib.sha256(json.dumps([nproc, *args]).encode()).hexdigest()[:12]

    def train(folder: Path) -> dict[str, Any]:
        run_training([*MACHINERY_ARGS, *args, "--output-dir", str(folder), "--run-name", "uninterrupted"], nproc=nproc)
        return {"args": list(args), "nproc": nproc}

    folder, _ = once_per_session(tmp_path_factory, f"reference-{key}", train)
    return folder / "uninterrupted"


def shared_reviews(tmp_path_factory: pytest.TempPathFactory, lines: int) -> list[str]:
    """:func:`support.repo.reviews`' ``--data-file`` arguments, the file written once per session: the same arguments in
    every file, so that the runs training on it can share their reference (:func:`reference_run`)."""
    _, record = once_per_session(tmp_path_factory, f"reviews-{lines}", lambda folder: {"args": reviews(folder, lines)})
    return record["args"]


def elastic_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 3-rank run every elastic run ends equal to (tests/distributed/test_elastic.py,
    tests/distributed/test_rendezvous_store.py)."""
    return reference_run(tmp_path_factory, ELASTIC_TRAINER_ARGS, nproc=3)


def forty_steps_of_2_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The training of the runs that a kill, a lost node or a stop interrupts (tests/distributed/test_training.py,
    test_faults.py, test_node_loss.py): 2 ranks of 4, dropout on; 320 reviews (256 training texts), 32 steps an
    epoch, so 40 steps cross an epoch boundary. Checkpoints and stop checks are each test's own (they change no
    weight): their reference, :func:`forty_steps_uninterrupted`, saves at its end only."""
    return ["--max-steps", "40", "--global-batch-size", "8", "--per-rank-batch-size", "4", "--classifier-dropout",
            "0.1", *shared_reviews(tmp_path_factory, 320)]


def forty_steps_uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :func:`forty_steps_of_2_ranks` never interrupted, once per session."""
    return reference_run(tmp_path_factory, [*forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "0"],
                         nproc=2)


# The sharded runs' arguments (tests/distributed/test_sharding.py, tests/distributed/test_sharding_resume.py): the
# machinery task, the same global batch of 16 with accumulation and clipping on, DDP's file layout for every strategy
# (compared key by key).
SHARDING_STEPS = 4


SHARDING_MAX_GRAD_NORM = 0.3


def sharding_run_args(data: list[str], output_dir: Path, name: str, per_rank: int, *extra: str) -> list[str]:
    return [*MACHINERY_ARGS, *data, "--output-dir", str(output_dir), "--run-name", name, "--global-batch-size", "16",
            "--per-rank-batch-size", str(per_rank), "--max-steps", str(SHARDING_STEPS), "--checkpoint-every", "2",
            "--classifier-dropout", "0", "--lr", "5e-4", "--max-grad-norm", str(SHARDING_MAX_GRAD_NORM),
            "--eval-every", "2", "--eval-batch-size", "4", "--dist-timeout-s", "60", "--checkpoint-format", "file",
            *extra]
