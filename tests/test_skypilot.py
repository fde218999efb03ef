"""The SkyPilot task (issue 36): deploy/skypilot/task.yaml loaded by SkyPilot 0.14's own loader, as ``sky launch
--env`` loads it, with broken variants it must refuse naming the field; scripts/worker.sh reading SkyPilot's
SKYPILOT_* variables itself (``--dry-run``: the torchrun line); and two emulated nodes on 127.0.0.1 and .2 running the
script that the job program of SkyPilot's own generator launches on each node (tests/standin/skypilot.py), with
exactly the variables SkyPilot sets, one node lost mid-run, the other cancelled as SkyPilot cancels it, both
launched again, the run resuming from its newest checkpoint.

The SkyPilot parts run SkyPilot in .venv-skypilot (requirements-skypilot.txt, `make setup`) with HOME in tmp_path:
it writes ~/.sky, and the node script does ``cd ~/sky_workdir``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import (
    MACHINERY_ARGS,
    REPO_ROOT,
    WORKER,
    clean_env,
    finish,
    free_port,
    kill_launcher,
    node_in_process,
    wait_for,
)

TASK = REPO_ROOT / "deploy" / "skypilot" / "task.yaml"
SKY_PYTHON = REPO_ROOT / ".venv-skypilot" / "bin" / "python"
STANDIN = REPO_ROOT / "tests" / "standin" / "skypilot.py"
needs_skypilot = pytest.mark.skipif(not SKY_PYTHON.exists(), reason="no .venv-skypilot: run `make setup`")


def skypilot(home: Path, *args: str) -> Any:
    """tests/standin/skypilot.py in SkyPilot's venv, HOME=home; its JSON answer."""
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    result = subprocess.run([str(SKY_PYTHON), str(STANDIN), *args], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


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


# --- two emulated nodes run the task's script --------------------------------------------------------------------

TRAINER_ARGS = ("--max-steps", "10", "--checkpoint-every", "4", "--global-batch-size", "8", "--per-rank-batch-size",
                "4", "--stop-check-every", "1")
# Node 1's agent and worker SIGKILLed after step 6, once per run directory: the newest checkpoint is step 4's.
LOST = "kill-node:rank=1:step=6"
# Short rendezvous timings, as tests/test_elastic.py: a dead node leaves the rendezvous after 3 missed 1-s heartbeats.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}


def cpu_task(tmp_path: Path) -> Path:
    """The task on CPU nodes (the emulated nodes have no GPUs): SkyPilot then computes 0 GPUs per node itself."""
    text = TASK.read_text()
    assert text.count("  accelerators: {A100: 8}") == 1
    path = tmp_path / "task-cpu.yaml"
    path.write_text(text.replace("  accelerators: {A100: 8}", "  cpus: 2+"))
    return path


def start_skypilot_node(home: Path, script: Path, out: Path) -> subprocess.Popen[str]:
    """One node as SkyPilot runs it (log_lib.run_bash_command_with_log: ``/bin/bash -i SCRIPT``), in a session of
    its own. The script exports SkyPilot's variables; the test adds only HOME, the interpreter and a thread each,
    the fault and short rendezvous timings."""
    with out.open("a") as sink:
        return subprocess.Popen(["/bin/bash", "-i", str(script)], cwd=home, stdout=sink, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True,
                                env=clean_env(HOME=str(home), PYTHON=sys.executable, OMP_NUM_THREADS="1",
                                              INJECT_FAULT=LOST, RDZV_JOIN_TIMEOUT="60", **RENDEZVOUS))


@needs_skypilot
@pytest.mark.distributed
def test_two_skypilot_nodes_train_lose_one_and_resume_when_launched_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # What `workdir: .` uploads: this checkout, as a project whose project.toml starts every job with the machinery
    # task (worker.sh --project-args reads it there); ARGS adds the run's own flags.
    workdir = home / "sky_workdir"
    workdir.mkdir()
    for entry in REPO_ROOT.iterdir():
        if entry.name != "project.toml":
            (workdir / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (workdir / "project.toml").write_text(f'[run]\nargs = ""\n[jobs]\nargs = "{" ".join(MACHINERY_ARGS)}"\n'
                                          "[image]\npython = []\napt = []\n")
    results = tmp_path / "results"
    args = " ".join(TRAINER_ARGS)
    assert "'" not in args and '"' not in args, "ARGS is split on spaces by the task's run script"
    overrides = {"BUCKET": "unused", "RUN_ID": "sky", "MAX_RESTARTS": "2", "ARGS": args,
                 "DISTQA_OUTPUT_DIR": str(results), "HF_HOME": str(tmp_path / "hf"), "RDZV_PORT": str(free_port())}
    # Two addresses, as two machines have: torch's rendezvous gives ranks in the order of its participants' addresses,
    # then their agents' pids, and kill-node:rank=1 must fall on node 1 (one address: whichever agent started first).
    environments = skypilot(home, "nodes", str(cpu_task(tmp_path)), "--ips", "127.0.0.1,127.0.0.2",
                            "--out", str(tmp_path / "scripts"), *[f"--env={k}={v}" for k, v in overrides.items()])
    assert environments["1"]["SKYPILOT_NUM_GPUS_PER_NODE"] == "0", "SkyPilot's own count for a CPU task"
    assert environments["1"]["SKYPILOT_NODE_IPS"] == "127.0.0.1\n127.0.0.2"

    outputs = [tmp_path / f"node-{rank}.out" for rank in range(2)]
    scripts = [tmp_path / "scripts" / f"node-{rank}.sh" for rank in range(2)]
    nodes = [start_skypilot_node(home, scripts[rank], outputs[rank]) for rank in range(2)]
    processes = list(nodes)
    try:
        wait_for(lambda: nodes[1].poll() is not None, timeout=240)  # the fault ended node 1
        # SkyPilot's job program then force-cancels the other nodes' scripts (RayCodeGen's get_or_fail, in
        # sky/backends/task_codegen.py: ray.cancel(force=True) once a node's return code is not 0): node 0 goes
        # down with its agent and worker, no checkpoint on the way. Launched again (`sky launch`, or a managed
        # job's recovery), every node runs its script anew with the same RUN_ID.
        kill_launcher(nodes[0])
        again = [start_skypilot_node(home, scripts[rank], outputs[rank]) for rank in range(2)]
        processes += again
        for process in again:
            finish(process, timeout=240)
    finally:
        for process in processes:
            kill_launcher(process)
    output_0, output_1 = (out.read_text() for out in outputs)
    assert nodes[1].returncode == 137, output_1  # the agent's SIGKILL, through worker.sh and SkyPilot's epilogue
    assert [process.returncode for process in again] == [0, 0], output_0 + output_1
    assert "node 1 of 2 at 127.0.0.2, rendezvous 127.0.0.1:" in output_1, "worker.sh read SKYPILOT_* itself"
    # Node 0 saved step 6, the last both completed, before SkyPilot's job program cancelled it
    # (distqa.training.peer_loss).
    resumed = f"resumed from {results / 'sky' / 'checkpoints' / 'step-00000006.pt'}"
    assert resumed in output_0 and resumed in output_1, output_0 + output_1
    assert (results / "sky" / "checkpoints" / "step-00000010.pt").exists(), "the run went on to its last step"
