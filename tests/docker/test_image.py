"""The real image (./Dockerfile) runs a 2-node DDP training: two containers on a user-defined
network, one torchrun agent each, meeting through scripts/worker.sh's c10d rendezvous; the project's own run
(project.toml's [run] args: the dummy task in the template, a fork's preset in a fork) and the example task outside
the package alike.

Needs Docker and the built image: `make test-docker` (tests/docker/run.sh) builds both and sets
DISTQA_TEST_IMAGE; without it these tests are skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from distqa.config.sources import load_config

from support.repo import REPO_ROOT

IMAGE = os.environ.get("DISTQA_TEST_IMAGE", "")
pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(not IMAGE, reason="needs the built image: run `make test-docker`")]


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def test_image_holds_no_secrets_and_runs_as_root() -> None:
    """Root, because the platform mounts storage with an owner it picks (root, 755) and `apolo run`
    cannot choose the user; scripts/worker.sh stops at start when a folder is not writable."""
    listing = docker("run", "--rm", IMAGE, "bash", "-c", "id -u; ls -A /project; echo HF_HOME=$HF_HOME").stdout
    uid, *entries = listing.split()
    assert uid == "0"
    assert not {".env", ".git", ".venv", "results/local", "tests"} & set(entries)
    assert "HF_HOME=/project/cache/huggingface" in entries
    assert docker("run", "--rm", IMAGE).stdout.startswith("The in-job entry point")  # CMD: worker.sh --help


FORK = "examples.text_classification.task:TextClassification"
BATCH = ["--max-steps", "4", "--checkpoint-every", "2", "--global-batch-size", "8", "--per-rank-batch-size", "4"]
QUIET = ["--progress-bar", "false", "--tensorboard", "false"]


def project_run() -> list[str]:
    """project.toml's [run] args: what `make run` trains here."""
    words = subprocess.run([sys.executable, str(REPO_ROOT / "src" / "distqa" / "upkeep" / "project.py"), "--split",
                            "run.args"], capture_output=True, text=True, check=True, timeout=60).stdout
    return words.splitlines()


@pytest.mark.parametrize("task", ["project", FORK])
def test_two_containers_train_to_a_checkpoint(task: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    network, nodes = f"distqa-test-{tag}", [f"distqa-node0-{tag}", f"distqa-node1-{tag}"]
    results = tmp_path / "results"  # shared storage: both containers mount it, as jobs mount a volume
    results.mkdir(mode=0o755)  # as `neuro-flow mkvolumes` leaves a folder: the owner's alone to write
    trainer = [*project_run(), *QUIET, *BATCH] if task == "project" else [
        "--task", FORK, *QUIET, "--eval-every", "2", *BATCH]
    expected_task = load_config(trainer, environ={}, dotenv_path=os.devnull, check_data_paths=False).task
    docker("network", "create", network)
    try:
        for rank, name in enumerate(nodes):
            master = ["--master-addr", nodes[0]] if rank else []
            docker("run", "--detach", "--name", name, "--hostname", name, "--network", network,
                   "--volume", f"{results}:/project/results", "--env", "DISTQA_OUTPUT_DIR=/project/results",
                   IMAGE, "bash", "scripts/worker.sh", "--nnodes", "2", "--node-rank", str(rank), *master,
                   "--master-port", "29400", "--run-id", "docker", "--", *trainer)
        codes = [int(docker("wait", name, timeout=400).stdout.strip()) for name in nodes]
        logs = [docker("logs", name).stdout + docker("logs", name).stderr for name in nodes]
    finally:
        docker("rm", "--force", *nodes, check=False)
        docker("network", "rm", network, check=False)
    assert codes == [0, 0], "\n\n".join(logs)
    addresses = [line.split(" at ")[1].split(",")[0] for log in logs for line in log.splitlines()
                 if line.startswith("worker.sh: run 'docker'")]
    assert len(set(addresses)) == 2 and not any(a.startswith("127.") for a in addresses), addresses
    run_dir = results / "docker"
    checkpoint = torch.load(run_dir / "checkpoints" / "step-00000004.pt", weights_only=True)
    assert checkpoint["world_size"] == 2 and checkpoint["saved_by_rank"] == 0
    assert checkpoint["config"]["task"] == expected_task
    if task == FORK:  # evaluated on both ranks, best.pt kept by the fork's own metric
        best = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
        assert best["progress"]["best_metric"] == "accuracy"
    run = json.loads((run_dir / "run.json").read_text())
    assert (run["nodes"], run["backend"]) == (2, "gloo")
    assert "training finished at step 4" in logs[0]
