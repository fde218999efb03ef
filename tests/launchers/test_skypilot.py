"""The SkyPilot task (issue 36): deploy/skypilot/task.yaml loaded by SkyPilot 0.14's own loader, as ``sky launch
--env`` loads it, with broken variants it must refuse naming the field; and scripts/worker.sh reading SkyPilot's
SKYPILOT_* variables itself (``--dry-run``: the torchrun line). The two-node run: tests/distributed/test_skypilot.py.

The SkyPilot parts run SkyPilot in .venv-skypilot (requirements-skypilot.txt, `make setup`) with HOME in tmp_path:
it writes ~/.sky."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from support.processes import clean_env, node_in_process
from support.repo import REPO_ROOT, WORKER
from support.skypilot import TASK, needs_skypilot, skypilot

# --- the task, as SkyPilot loads it ----------------------------------------------------------------------------

# Each broken variant: (what is replaced, by what, what SkyPilot's message must name).
BROKEN = {
    "typo": ("num_nodes: 2", "num_node: 2", "num_node"),
    "wrong-type": ("num_nodes: 2", "num_nodes: two", "$.num_nodes"),
    "resources-typo": ("  accelerators: {A100: 8}", "  accelerator: {A100: 8}", "accelerator"),
    "mount-mode": ("    mode: MOUNT\n", "    mode: MOUNTED\n", "$.mode"),
    "resources-type": ("  use_spot: false", "  use_spot: sometimes", "$.use_spot"),
    "mount-typo": ("    name: ${BUCKET}", "    nmae: ${BUCKET}", "nmae"),
}


@needs_skypilot
def test_skypilot_loads_the_task_and_refuses_each_broken_variant(tmp_path: Path) -> None:
    text = TASK.read_text()
    # `sky launch --env BUCKET=...` is how the bucket is given; the variants fill it in their text instead, so that
    # one run of SkyPilot loads them all, the task itself without it too.
    filled = text.replace("  BUCKET: null", "  BUCKET: distqa-test-bucket")
    assert filled != text
    paths = {"task": str(TASK), "filled": str(tmp_path / "filled.yaml")}
    Path(paths["filled"]).write_text(filled)
    for name, (old, new, _) in BROKEN.items():
        assert filled.count(old) == 1, name
        paths[name] = str(tmp_path / f"{name}.yaml")
        Path(paths[name]).write_text(filled.replace(old, new))
    loaded = {Path(r["path"]).stem: r for r in skypilot(tmp_path / "home", "load", *paths.values())}

    assert "BUCKET" in loaded["task"]["error"], "the bucket is required, as SkyPilot says"
    task = loaded["filled"]["task"]
    assert task["num_nodes"] == 2
    assert task["images"] == ["ghcr.io/YOUR_ORG/distqa:v1"], "the project's image, as a docker: image_id"
    assert task["mounts"] == {"/distqa": {"bucket": "distqa-test-bucket", "mode": "MOUNT"}}
    envs = task["envs"]
    assert {"RUN_ID", "ARGS", "MAX_RESTARTS", "ENTRY_MODULE", "DISTQA_TRACKER", "MLFLOW_TRACKING_URI"} <= envs.keys()
    assert task["secrets"] == ["MLFLOW_TRACKING_TOKEN"]
    # Everything a resume and the other nodes read is on the bucket.
    assert envs["DISTQA_OUTPUT_DIR"].startswith("/distqa/") and envs["HF_HOME"].startswith("/distqa/")
    assert "bash scripts/worker.sh" in task["run"] and "exec " not in task["run"]
    page = (REPO_ROOT / "docs" / "SKYPILOT.md").read_text()
    assert not [name for name in [*envs, *task["secrets"]] if f"`{name}`" not in page], "docs/SKYPILOT.md's table"
    for name, (_, _, field) in BROKEN.items():
        assert "error" in loaded[name], f"SkyPilot loaded the broken variant '{name}'"
        assert field in loaded[name]["error"], (name, loaded[name]["error"])


# --- worker.sh under SkyPilot's variables ----------------------------------------------------------------------

def dry_run(*flags: str, through_worker_sh: bool = False, **skypilot_env: str) -> subprocess.CompletedProcess[str]:
    """``worker.sh --dry-run`` under SkyPilot's variables: the node in this process, or through worker.sh itself."""
    env = clean_env(PYTHON=sys.executable, **skypilot_env)
    env.pop("NODE_ADDR", None)
    argv = ["--dry-run", "--run-id", "sky", *flags, "--", "--preset", "none"]
    if not through_worker_sh:
        return node_in_process(argv, env)
    return subprocess.run(["bash", WORKER, *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def skypilot_node(rank: int, gpus: int, ips: str = "10.0.0.1\n10.0.0.2", nodes: int = 2) -> dict[str, str]:
    return {"SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_NODES": str(nodes),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus)}


def test_worker_takes_the_node_count_rank_addresses_and_gpus_from_skypilot() -> None:
    node_1 = dry_run(through_worker_sh=True, **skypilot_node(1, gpus=8))
    assert node_1.returncode == 0, node_1.stderr
    command = shlex.split(node_1.stdout)
    assert command[command.index("distqa.launch.agent") + 1] == "1", "SKYPILOT_NODE_RANK"
    for flag, value in [("--nnodes", "2"), ("--nproc-per-node", "8"), ("--rdzv-endpoint", "10.0.0.1:29400"),
                        ("--local-addr", "10.0.0.2")]:
        assert command[command.index(flag) + 1] == value, (flag, node_1.stdout)
    assert "is_host=0" in node_1.stdout
    assert "warning" not in node_1.stderr.lower(), node_1.stderr

    # CPU nodes: SkyPilot says 0 GPUs; worker.sh's own default (one per visible GPU, else 1) applies.
    cpu_0 = dry_run(**skypilot_node(0, gpus=0))
    assert cpu_0.returncode == 0, cpu_0.stderr
    command = shlex.split(cpu_0.stdout)
    assert command[command.index("--nproc-per-node") + 1] == "1"
    assert command[command.index("--local-addr") + 1] == "10.0.0.1" and "is_host=1" in cpu_0.stdout
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400", "node 0 hosts at its own address"
    assert "warning" not in cpu_0.stderr.lower(), cpu_0.stderr

    # What the command line gives wins over SkyPilot's variables.
    flags = dry_run("--nproc-per-node", "2", "--master-port", "29555", "--master-addr", "10.9.9.9",
                    **skypilot_node(1, gpus=8))
    command = shlex.split(flags.stdout)
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.9.9.9:29555"
