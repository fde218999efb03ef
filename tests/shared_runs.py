"""Runs that several test files check, started once per test session, and the arguments they share.

No test file imports another (tests/test_structure.py checks it): what two files share lives here or in conftest.
A run that more than one module compares against (the uninterrupted 3-rank elastic run) is made by
:func:`once_per_session`: under pytest-xdist the first worker to ask runs it while the others wait for its record,
so it costs one run whichever workers take the modules.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import MACHINERY_ARGS, finish, start_training


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


# The elastic runs (tests/test_elastic.py, tests/test_rendezvous_store.py). 12 examples per step: 2 per rank × 3
# ranks × 2 micro-batches, or × 2 ranks × 3. Dropout off: the weights of a run that changed its world size equal the
# uninterrupted run's (dropout masks are drawn per rank).
ELASTIC_TRAINER_ARGS = ("--max-steps", "14", "--checkpoint-every", "4", "--global-batch-size", "12",
                        "--per-rank-batch-size", "2", "--classifier-dropout", "0", "--stop-check-every", "1")
# Short rendezvous timings (worker.sh passes them to torchrun's c10d rendezvous): a round completes 1 s after its
# minimum has joined, and a dead node leaves the rendezvous after 3 missed 1-s heartbeats.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}
# One restart: the lost node and its return are membership changes, which spend none (distqa.launch.agent gives back
# the restart its survivors' exit 76 cost, distqa.training.peer_loss), so a run that lost a node and got it back still
# has it.
ELASTIC_NODE_ARGS = ("--min-nodes", "2", "--max-restarts", "1", "--join-timeout", "60")


def elastic_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of the uninterrupted 3-rank run every elastic run ends equal to (once per session)."""

    def train(folder: Path) -> dict[str, Any]:
        output = folder / "uninterrupted.out"
        reference = start_training([*MACHINERY_ARGS, *ELASTIC_TRAINER_ARGS, "--output-dir", str(folder),
                                    "--run-name", "uninterrupted"], output, nproc=3)
        finish(reference, timeout=240)
        assert reference.returncode == 0, output.read_text()
        return {"returncode": reference.returncode}

    folder, _ = once_per_session(tmp_path_factory, "elastic-reference", train)
    return folder / "uninterrupted"


# The sharded runs' arguments (tests/test_sharding.py, tests/test_sharding_resume.py): the machinery task, the same
# global batch of 16 with accumulation and clipping on, DDP's file layout for every strategy (compared key by key).
SHARDING_STEPS = 4
SHARDING_MAX_GRAD_NORM = 0.3


def sharding_run_args(data: list[str], output_dir: Path, name: str, per_rank: int, *extra: str) -> list[str]:
    return [*MACHINERY_ARGS, *data, "--output-dir", str(output_dir), "--run-name", name, "--global-batch-size", "16",
            "--per-rank-batch-size", str(per_rank), "--max-steps", str(SHARDING_STEPS), "--checkpoint-every", "2",
            "--classifier-dropout", "0", "--lr", "5e-4", "--max-grad-norm", str(SHARDING_MAX_GRAD_NORM),
            "--eval-every", "2", "--eval-batch-size", "4", "--dist-timeout-s", "60", "--checkpoint-format", "file",
            *extra]
