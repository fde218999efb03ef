"""The SkyPilot task (issue 36) on two emulated nodes on 127.0.0.1 and .2, each running the script that the job program
of SkyPilot's own generator launches on it (tests/standin/skypilot.py), with exactly the variables SkyPilot sets: one
node lost mid-run, the other cancelled as SkyPilot cancels it, both launched again, the run resuming from its newest
checkpoint. SkyPilot runs in .venv-skypilot (requirements-skypilot.txt, `make setup`) with HOME in tmp_path. Loading
the task and worker.sh's reading of SkyPilot's variables: tests/launchers/test_skypilot.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.processes import clean_env, free_port, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import finish, kill_launcher
from support.skypilot import TASK, needs_skypilot, skypilot

# --- two emulated nodes run the task's script --------------------------------------------------------------------

TRAINER_ARGS = ("--max-steps", "10", "--checkpoint-every", "4", "--global-batch-size", "8", "--per-rank-batch-size",
                "4", "--stop-check-every", "1")
# Node 1's agent and worker SIGKILLed after step 6, once per run directory: the newest checkpoint is step 4's.
LOST = "kill-node:rank=1:step=6"
# Short rendezvous timings, as tests/distributed/test_elastic.py: a dead node leaves the rendezvous after 3 missed 1-s
# heartbeats.
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
