"""The platform recipe's runs without the platform: the platform launcher (python -m distqa.launch.platform, which
scripts/run_distributed_on_platform.sh execs) driving a stand-in neuro-flow that runs each job's rendered command as a
local process with its own loopback address (tests/standin/platform_cli.py, tests/support/apolo.py): two nodes to
a checkpoint, failures, Ctrl-C, lost and resubmitted jobs, the external store's job lost, a sweep on the platform.
Each case starts the launcher once, through the script itself where the claim is about the script (the two-node run,
ENV_FILE, the sweep). live.yml, the dry runs and the refusals: tests/launchers/test_platform.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from support.apolo import (
    STORE,
    events,
    finish,
    jobs,
    launch,
    platform_fixture,  # noqa: F401  (the fixture `platform`)
    start_platform,
    stop_platform,
)
from support.processes import free_port, wait_for
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.shared_runs import once_per_session

PROJECT_ID = re.search(r"^id: (\S+)", (REPO_ROOT / ".neuro" / "project.yml").read_text(), re.MULTILINE)[1]
"""The project's id (its storage folder on the platform: a fork names its own)."""
TRAIN_ARGS = [*MACHINERY_ARGS, "--max-steps", "4", "--checkpoint-every", "2", "--global-batch-size", "8",
              "--per-rank-batch-size", "4"]


def run_processes(run_id: str) -> list[int]:
    """Live processes (agents or workers) of the run, found by torchrun's run id in their environment."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0") if proc.name.isdigit() else []
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"distqa.train" in cmdline and (f"TORCHELASTIC_RUN_ID={run_id}".encode() in environ
                                           or f"--rdzv-id\0{run_id}\0".encode() in cmdline):
            found.append(int(proc.name))
    return found


def test_launcher_runs_two_nodes_to_a_checkpoint_on_the_results_volume(platform: dict[str, str]) -> None:
    launcher = launch(platform, "e2e", "--", *TRAIN_ARGS, "--tensorboard", "true", script=True)
    output = finish(launcher, timeout=300)
    assert launcher.returncode == 0, output
    results = Path(platform["STANDIN_PLATFORM_DIR"]) / "storage" / PROJECT_ID / "results" / "e2e"
    checkpoint = torch.load(results / "checkpoints" / "step-00000004.pt", weights_only=True)
    assert checkpoint["world_size"] == 2 and checkpoint["saved_by_rank"] == 0
    assert checkpoint["config"]["run_name"] == "e2e" and checkpoint["config"]["max_steps"] == 4
    run = json.loads((results / "run.json").read_text())
    assert (run["world_size"], run["nodes"], run["backend"]) == (2, 2, "gloo")
    assert sorted(p.name for p in (results / "logs").iterdir()) == ["rank-0.log", "rank-1.log"]
    assert len(list((results / "tensorboard").iterdir())) == 1
    started = jobs(platform)
    assert {k: j["status"] for k, j in started.items()} == {"distributed_training-e2e-0": "succeeded",
                                                            "distributed_training-e2e-1": "succeeded"}
    master, worker = started["distributed_training-e2e-0"], started["distributed_training-e2e-1"]
    assert master["hostname"] != worker["hostname"]
    assert worker["params"]["master_addr"] == master["hostname"]  # read from the master's status
    assert worker["params"]["run_id"] == master["params"]["run_id"] == "e2e"
    assert master["cli"] == "apolo-flow", "apolo-flow is preferred when both names are installed"
    assert "master distributed_training e2e-0 is running at" in output
    assert "training finished at step 4" in output, "the master's logs are streamed"
    assert "node 0 of 2" in output and "finished on all 2 nodes" in output


def test_a_failing_worker_stops_every_job_and_the_launcher_fails(platform: dict[str, str]) -> None:
    env = {**platform, "FLOW_CLI": "neuro-flow"}
    launcher = launch(env, "fail", "--", *MACHINERY_ARGS, "--max-steps", "100000", "--checkpoint-every", "0")
    try:
        master = Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs" / "distributed_training-fail-0.log"
        wait_for(lambda: master.exists() and "step 2/" in master.read_text(), timeout=240)  # training
        agent = jobs(platform)["distributed_training-fail-1"]["pid"]
        os.kill(agent, signal.SIGKILL)  # node 1 dies: its job fails
    finally:
        output = finish(launcher, timeout=180)
    assert launcher.returncode == 1, output
    assert "node 1 (distributed_training fail-1) failed" in output
    assert "stopping every job of run 'fail'" in output
    statuses = {k: j["status"] for k, j in jobs(platform).items()}
    # The teardown of node 1's job SIGTERMs what its main process left (as a container stop does), so
    # node 1's worker asks for a graceful stop (distqa.distributed.stop) and node 0's stops with it, checkpoint
    # written, exit 75: node 0's job may end by itself before the launcher's kill cancels it.
    assert statuses["distributed_training-fail-1"] == "failed"
    assert statuses["distributed_training-fail-0"] in {"cancelled", "failed"}, statuses
    assert {j["cli"] for j in jobs(platform).values()} == {"neuro-flow"}
    wait_for(lambda: not run_processes("fail"), timeout=30)


# One run that two tests check (started once per session, support.shared_runs.once_per_session): 3 nodes, whose workers
# the platform holds pending until both are submitted; once node 0 trains, Ctrl-C. A batch that 3 ranks split evenly:
# the jobs train until the Ctrl-C instead of failing on their own, which would race the interrupt (the launcher's own
# failure path exits 1, not 130).
INTERRUPTED_WORKERS = [f"distributed_training-intr-{rank}" for rank in (1, 2)]


def interrupted_run_record(folder: Path) -> dict[str, Any]:
    platform = start_platform(folder)
    try:
        held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held"
        held.mkdir(parents=True)
        for key in INTERRUPTED_WORKERS:
            (held / key).touch()
        launcher = launch(platform, "intr", "--timeout", "300", "--", *MACHINERY_ARGS, "--max-steps", "100000",
                          "--checkpoint-every", "0", "--stop-check-every", "1", "--global-batch-size", "24",
                          "--per-rank-batch-size", "8", nodes=3)
        logs = Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs"
        try:
            wait_for(lambda: set(INTERRUPTED_WORKERS) <= set(jobs(platform)), timeout=120)  # seconds when quiet
            pending = [jobs(platform)[key]["status"] for key in INTERRUPTED_WORKERS]
            for key in INTERRUPTED_WORKERS:
                (held / key).unlink()
            wait_for(lambda: (logs / "distributed_training-intr-0.log").exists()
                     and "step 2/" in (logs / "distributed_training-intr-0.log").read_text(), timeout=240)
            os.killpg(launcher.pid, signal.SIGINT)
        finally:
            output = finish(launcher, timeout=120)
        statuses = {k: j["status"] for k, j in jobs(platform).items()}
        # the jobs' processes stop after the launcher has returned, as on the platform; each main process exits 75
        wait_for(lambda: all("exit_code" in j for j in jobs(platform).values()), timeout=60)
        wait_for(lambda: not run_processes("intr"), timeout=60)
        results = Path(platform["STANDIN_PLATFORM_DIR"]) / "storage" / PROJECT_ID / "results" / "intr"
        return {"returncode": launcher.returncode, "output": output, "pending": pending, "statuses": statuses,
                "jobs": jobs(platform), "events": events(platform),
                "logs": {rank: (logs / f"distributed_training-intr-{rank}.log").read_text() for rank in range(3)},
                "checkpoints": sorted(p.name for p in (results / "checkpoints").glob("step-*.pt"))}
    finally:
        stop_platform(platform)


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return once_per_session(tmp_path_factory, "platform-interrupted-run", interrupted_run_record)[1]


def test_ctrl_c_kills_every_job_and_each_stops_with_a_checkpoint_of_the_step_reached(
        interrupted_run: dict[str, Any]) -> None:
    """Ctrl-C (SIGINT to the launcher's process group) once node 0 trains: every job is cancelled and the launcher
    exits 130. Each job's worker.sh gets SIGTERM alone, as the platform's pod deletion sends it (the stand-in
    follows platform-api and Kubernetes), so the workers stop gracefully: each job's command exits 75, one
    checkpoint, of the step reached (no periodic one), is on the results volume, and each node's "stopped by"
    line is in its job's log."""
    output = interrupted_run["output"]
    assert interrupted_run["returncode"] == 130, output
    assert "each job got SIGTERM: its workers checkpoint the step they reach and stop" in output
    assert set(interrupted_run["statuses"].values()) == {"cancelled"}
    assert [j["exit_code"] for j in interrupted_run["jobs"].values()] == [75, 75, 75]
    logs = interrupted_run["logs"]
    stops = [re.search(rf"worker.sh: run 'intr' node {rank}: stopped by SIGTERM at step (\d+), checkpoint .* "
                       r"written; exit code 75", logs[str(rank)]) for rank in range(3)]
    assert all(stops), [text[-3000:] for text in logs.values()]
    step = int(stops[0][1])
    assert int(stops[1][1]) == int(stops[2][1]) == step >= 2
    assert interrupted_run["checkpoints"] == [f"step-{step:08d}.pt"]


def test_workers_start_together_and_the_rendezvous_outwaits_their_scheduling(interrupted_run: dict[str, Any]) -> None:
    """Each `run` returns only when its job has started. The platform holds both workers pending until both
    are submitted: a launcher that submitted one worker after another's `run` returned would never submit
    the second. The master's rendezvous join timeout is the schedule timeout plus a margin."""
    assert interrupted_run["pending"] == ["pending", "pending"]
    assert interrupted_run["returncode"] == 130, interrupted_run["output"]
    order = [(e["key"], e["event"]) for e in interrupted_run["events"]]
    master, workers = "distributed_training-intr-0", INTERRUPTED_WORKERS
    for worker in workers:  # each worker is pointed at the master's address, known once it runs
        assert order.index((master, "running")) < order.index((worker, "submitted")), order
    for submitted, other in (workers, workers[::-1]):  # both submitted before either started
        assert order.index((submitted, "submitted")) < order.index((other, "running")), order
    started = interrupted_run["jobs"]
    assert started[master]["schedule_timeout"] == 300
    command = started[master]["command"]
    assert command[command.index("--join-timeout") + 1] == "600"


def test_kill_distributed_kills_the_jobs_of_a_run(platform: dict[str, str]) -> None:
    """Every node's job and the run's rendezvous store (--external-store): the store outlives a launcher that was
    itself killed until its life span."""
    for rank in range(2):  # a run whose launcher is gone: the master waits for a third node forever
        subprocess.run(["neuro-flow", "run", "distributed_training", "--suffix", f"k-{rank}", "--param", "nodes", "3",
                        "--param", "node_rank", str(rank), "--param", "master_addr", "127.0.0.10", "--param",
                        "run_id", "k", "--param", "master_port", str(free_port())],
                       env=platform, check=True, capture_output=True, timeout=60)
    subprocess.run(["neuro-flow", "run", "rendezvous_store", "--suffix", "k", "--param", "run_id", "k", "--param",
                    "port", str(free_port())], env=platform, check=True, capture_output=True, timeout=60)
    wait_for(lambda: {j["status"] for j in jobs(platform).values()} == {"running"} and len(jobs(platform)) == 3,
             timeout=60)
    killed = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "kill_distributed.sh"), "--run-id", "k",
                             "--nodes", "3"], env=platform, capture_output=True, text=True, timeout=120)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert {j["status"] for j in jobs(platform).values()} == {"cancelled"}
    wait_for(lambda: not run_processes("k"), timeout=30)


# --- a node range: the launcher submits a lost node's job again -------------------------------------------------

# Short rendezvous timings (worker.sh hands them to torchrun's c10d rendezvous; the stand-in's jobs inherit the
# launcher's environment): a round completes 1 s after its minimum has joined.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}
RESUBMITTED = re.compile(r"node 1 \(job (job-\S+), distributed_training (\S+)-1\) failed: exit code (\d+) \((.*?)\); "
                         r"resubmitting it \((\d) of (\d)\)")


def submissions(env: dict[str, str], key: str) -> int:
    return sum(1 for e in events(env) if e["key"] == key and e["event"] == "submitted")


def kill_when_running(env: dict[str, str], key: str) -> None:
    """SIGKILL the job's main process (its worker.sh) once it runs: the node is lost and its job fails (whether
    or not the launcher's `flow run` for it has returned yet)."""
    record = wait_for(lambda: (j := jobs(env).get(key)) and j["status"] == "running" and j, timeout=120)
    os.kill(record["pid"], signal.SIGKILL)


ALONE = re.compile(r"membership: round \d+: 1 node\(s\)")


def rejoined_after_the_survivor_went_on_alone(platform: dict[str, str], launcher: subprocess.Popen[str], lost: str,
                                              survivor: str) -> str:
    """The launcher's output once it ended, the lost node's resubmitted job held pending (the stand-in's ``held``
    file, a platform with no free node for it) until the survivor's log shows its round alone. A node that started
    again sooner would join the survivor's next round before it formed (a race a fast node start wins), and the run
    would never go on without it, which is the claim. Held, the job is only delayed; its first job is not held."""
    held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held" / lost
    survivor_log = Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs" / f"{survivor}.log"
    try:
        wait_for(lambda: jobs(platform).get(lost, {}).get("status") == "running", timeout=120)
        held.parent.mkdir(exist_ok=True)
        held.touch()  # before the fault at step 2: the job is running, its node not yet trained a step
        wait_for(lambda: survivor_log.is_file() and ALONE.search(survivor_log.read_text()), timeout=240)
    except BaseException:
        with contextlib.suppress(AssertionError):  # the launcher and its jobs end with the test
            finish(launcher, timeout=0)
        raise
    finally:
        held.unlink(missing_ok=True)
    return finish(launcher, timeout=300)


def test_with_a_range_a_failed_job_is_resubmitted_once_and_the_run_grows_back_and_ends(
        platform: dict[str, str]) -> None:
    """2 nodes, --min-nodes 1: node 1 is lost after step 2 (its agent and worker SIGKILLed: its worker.sh, the
    job's main process, exits 137); node 0 goes on alone and waits after step 4 until a new round restarts it.
    The launcher says so in one line and submits node 1's job again; that job joins the round, and the run
    ends on both nodes."""
    env = {**platform, **RENDEZVOUS, "INJECT_FAULT": "kill-node:rank=1:step=2,pause:rank=0:step=4"}
    launcher = launch(env, "rs", "--min-nodes", "1", "--", *MACHINERY_ARGS, "--max-steps", "6", "--checkpoint-every",
                      "2", "--global-batch-size", "8", "--per-rank-batch-size", "4", "--stop-check-every", "1")
    output = rejoined_after_the_survivor_went_on_alone(platform, launcher, "distributed_training-rs-1",
                                                       "distributed_training-rs-0")
    assert launcher.returncode == 0, output
    lines = RESUBMITTED.findall(output)
    assert [line[1:] for line in lines] == [("rs", "137", "Error", "1", "3")], output
    assert submissions(platform, "distributed_training-rs-1") == 2
    final = jobs(platform)["distributed_training-rs-1"]
    assert final["status"] == "succeeded" and final["id"] != lines[0][0]  # a new job, the same node rank
    assert final["params"]["node_rank"] == "1" and final["params"]["min_nodes"] == "1"
    assert "finished on all 2 nodes" in output
    log = (Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs" / "distributed_training-rs-0.log").read_text()
    assert ALONE.search(log) and "training finished at step 6" in log, log


def test_a_job_that_keeps_failing_is_resubmitted_up_to_the_bound_then_left_out(
        platform: dict[str, str], tmp_path: Path) -> None:
    """--max-resubmits 2: node 1 is lost, and the platform cannot place its new jobs (held: each fails after
    --timeout 2 s, as a job not scheduled in time). Two resubmissions, each with its line, then one line that
    the run goes on without node 1, while node 0 trains on alone (until the Ctrl-C that ends the test)."""
    held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held"
    held.mkdir(parents=True)
    key = "distributed_training-rb-1"
    out = tmp_path / "launcher.out"
    launcher = launch({**platform, **RENDEZVOUS}, "rb", "--min-nodes", "1", "--max-resubmits", "2", "--timeout", "2",
                      "--", *MACHINERY_ARGS, "--max-steps", "100000", "--checkpoint-every", "0", "--stop-check-every",
                      "1", output=out)
    try:
        wait_for(lambda: "all 2 nodes are running" in out.read_text(), timeout=120)  # a node lost mid-run
        (held / key).touch()
        kill_when_running(platform, key)
        wait_for(lambda: "(--max-resubmits)" in out.read_text(), timeout=120)
        assert jobs(platform)["distributed_training-rb-0"]["status"] == "running"
        os.killpg(launcher.pid, signal.SIGINT)
    finally:
        finish(launcher, timeout=120)
    output = out.read_text()
    assert launcher.returncode == 130, output
    counts = [line[4:] for line in RESUBMITTED.findall(output)]
    assert counts == [("1", "2"), ("2", "2")], output
    assert re.search(r"node 1 \(job job-\S+, distributed_training rb-1\) failed: exit code 125 \(not scheduled "
                     r"within the schedule timeout \(2 s\)\); submitted again 2 time\(s\) \(--max-resubmits\): the "
                     r"others go on without it", output), output
    assert submissions(platform, key) == 3
    wait_for(lambda: not run_processes("rb"), timeout=60)


@pytest.mark.parametrize("node_range", [False, True], ids=["fixed-nodes", "min-nodes"])
def test_a_node_that_fails_before_its_run_returns_is_a_lost_node_not_an_unscheduled_one(
        platform: dict[str, str], tmp_path: Path, node_range: bool) -> None:
    """Node 1's job starts and fails (its worker.sh SIGKILLed, exit 137) before its `flow run` has returned: the CLI's
    status reply comes late (the stand-in's late/ file), and `run` then ends with the job's exit code, not 125. The
    launcher says that the node started and ended, never that the platform could not start it. With a fixed node
    count the run stops on that node's failure; with --min-nodes the node is submitted again."""
    # A run id of each case's own: the stand-in finds a job's supervisor by its name, so two cases running at once
    # under one name (pytest-xdist) would kill each other's jobs.
    run_id = "fr" if node_range else "fe"
    key = f"distributed_training-{run_id}-1"
    late = Path(platform["STANDIN_PLATFORM_DIR"]) / "late"
    late.mkdir(parents=True)
    (late / key).touch()
    out = tmp_path / "launcher.out"
    node_range_flags = ("--min-nodes", "1") if node_range else ()
    launcher = launch({**platform, **RENDEZVOUS}, run_id, *node_range_flags, "--", *MACHINERY_ARGS, "--max-steps",
                      "100000", "--checkpoint-every", "0", output=out)
    try:
        kill_when_running(platform, key)
        wait_for(lambda: jobs(platform)[key]["status"] == "failed", timeout=60)
        (late / key).unlink()
        if node_range:
            wait_for(lambda: RESUBMITTED.search(out.read_text()), timeout=120)
            os.killpg(launcher.pid, signal.SIGINT)
    finally:
        (late / key).unlink(missing_ok=True)
        finish(launcher, timeout=120)
    output = out.read_text()
    assert f"node 1 (distributed_training {run_id}-1) started and has already ended (failed)" in output, output
    assert "was not started within" not in output and "all 2 nodes were started" in output, output
    if node_range:
        assert launcher.returncode == 130, output
        assert [line[1:4] for line in RESUBMITTED.findall(output)] == [("fr", "137", "Error")], output
    else:
        assert launcher.returncode == 1, output
        assert "node 1 (distributed_training fe-1) failed; its logs: " in output, output
        assert submissions(platform, key) == 1
    wait_for(lambda: not run_processes(run_id), timeout=60)


def test_ctrl_c_with_a_resubmitted_job_kills_every_job_and_resubmits_nothing(platform: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """Node 1 is lost and its new job waits for a node (held); Ctrl-C then cancels node 0's job and the new one,
    and nothing is submitted after it."""
    held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held"
    held.mkdir(parents=True)
    out = tmp_path / "launcher.out"
    launcher = launch({**platform, **RENDEZVOUS}, "rc", "--min-nodes", "1", "--", *MACHINERY_ARGS, "--max-steps",
                      "100000", "--checkpoint-every", "0", "--stop-check-every", "1", output=out)
    key = "distributed_training-rc-1"
    try:
        wait_for(lambda: "all 2 nodes are running" in out.read_text(), timeout=120)  # a node lost mid-run
        (held / key).touch()
        kill_when_running(platform, key)
        wait_for(lambda: submissions(platform, key) == 2 and jobs(platform)[key]["status"] == "pending", timeout=120)
        os.killpg(launcher.pid, signal.SIGINT)
    finally:
        finish(launcher, timeout=120)
    output = out.read_text()
    assert launcher.returncode == 130, output
    assert len(RESUBMITTED.findall(output)) == 1, output
    assert {k: j["status"] for k, j in jobs(platform).items()} == {"distributed_training-rc-0": "cancelled",
                                                                   key: "cancelled"}
    assert submissions(platform, key) == 2
    wait_for(lambda: not run_processes("rc"), timeout=60)


# --- --external-store: the rendezvous store in a CPU job of its own, node 0 a node like any other -----------------

def test_with_an_external_store_node_0_is_resubmitted_and_the_run_grows_back_and_ends(
        platform: dict[str, str]) -> None:
    """The resubmission test above with node 0 lost: without --external-store node 0 hosts the store and is never
    submitted again. Node 0's job gets the higher address (pinned), so torch's rendezvous ranks it 1 and
    INJECT_FAULT's kill-node:rank=1 kills node 0's agent and worker after step 2; node 1 goes on alone and waits
    after step 4 until node 0's new job joins. The run ends on both nodes; the store's job is killed at the end."""
    address = Path(platform["STANDIN_PLATFORM_DIR"]) / "address"
    address.mkdir(parents=True)
    (address / "distributed_training-x0-0").write_text("127.0.0.90")
    env = {**platform, **RENDEZVOUS, "INJECT_FAULT": "kill-node:rank=1:step=2,pause:rank=0:step=4"}
    launcher = launch(env, "x0", "--external-store", "--min-nodes", "1", "--", *MACHINERY_ARGS, "--max-steps", "6",
                      "--checkpoint-every", "2", "--global-batch-size", "8", "--per-rank-batch-size", "4",
                      "--stop-check-every", "1")
    output = rejoined_after_the_survivor_went_on_alone(platform, launcher, "distributed_training-x0-0",
                                                       "distributed_training-x0-1")
    assert launcher.returncode == 0, output
    resubmitted = re.findall(r"node 0 \(job (job-\S+), distributed_training x0-0\) failed: exit code 137 \(Error\); "
                             r"resubmitting it \(1 of 3\)", output)
    assert len(resubmitted) == 1, output
    assert submissions(platform, "distributed_training-x0-0") == 2
    final = jobs(platform)
    assert final["distributed_training-x0-0"]["status"] == "succeeded"
    assert final["distributed_training-x0-0"]["id"] != resubmitted[0]  # a new job, the same node rank
    assert final["distributed_training-x0-1"]["status"] == "succeeded"
    assert final[f"{STORE}-x0"]["status"] == "cancelled" and "finished on all 2 nodes" in output
    order = [(e["key"], e["event"]) for e in events(platform)]
    assert order.index(("distributed_training-x0-1", "succeeded")) < order.index((f"{STORE}-x0", "cancelled"))
    logs = Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs"
    node_0 = (logs / "distributed_training-x0-0.log").read_text()  # both of node 0's jobs
    assert "fault injection (INJECT_FAULT): kill-node rank 1 after step 2 now" in node_0, node_0
    node_1 = (logs / "distributed_training-x0-1.log").read_text()
    assert re.search(r"membership: round \d+: 1 node\(s\) \(node 1 at ", node_1), node_1
    assert "training finished at step 6" in node_1, node_1
    wait_for(lambda: not run_processes("x0"), timeout=60)


def test_the_store_job_failing_ends_the_run_in_one_line(platform: dict[str, str]) -> None:
    """The store's process is killed while both nodes train, with a range: no node is resubmitted (none could meet
    again), one line names the store's job and how it ended, every job is killed and the launcher exits 1."""
    launcher = launch({**platform, **RENDEZVOUS}, "xf", "--external-store", "--min-nodes", "1", "--",
                      *MACHINERY_ARGS, "--max-steps", "100000", "--checkpoint-every", "0", "--stop-check-every", "1")
    logs = Path(platform["STANDIN_PLATFORM_DIR"]) / "jobs"
    try:
        wait_for(lambda: any("step 2/" in path.read_text() for path in logs.glob("distributed_training-xf-*.log")),
                 timeout=240)
        os.kill(jobs(platform)[f"{STORE}-xf"]["pid"], signal.SIGKILL)
    finally:
        output = finish(launcher, timeout=180)
    assert launcher.returncode == 1, output
    lines = [line for line in output.splitlines() if "rendezvous store's job" in line]
    assert len(lines) == 1 and re.search(
        rf"the rendezvous store's job \({STORE} xf, job job-\S+\) ended: failed: exit code 137 \(Error\); every node's "
        r"rendezvous is gone with it", lines[0]), output
    assert "resubmitting" not in output and "stopping every job of run 'xf'" in output
    statuses = {k: j["status"] for k, j in jobs(platform).items()}
    assert statuses.pop(f"{STORE}-xf") == "failed"
    assert set(statuses.values()) <= {"cancelled", "failed"} and len(statuses) == 2, statuses
    wait_for(lambda: not run_processes("xf"), timeout=60)


# --- a sweep whose trials are platform jobs -----------------------------------------------------

PLATFORM_SWEEP = """
search = "grid"
[fixed]
eval_every = 100000
checkpoint_every = 0
global_batch_size = 8
per_rank_batch_size = 4
[space]
max_steps = [100000, 6, 8]
[prune]
rule = "none"
"""


def test_a_sweep_runs_two_trials_at_once_each_on_two_platform_jobs_and_records_a_cancelled_one_as_failed(
        platform: dict[str, str], tmp_path: Path) -> None:
    """``python -m distqa.sweep --launcher platform --nodes 2 --parallel 2``: trial 0 (long) and trial 1 run at once,
    each as 2 jobs of the launcher; trial 1's master is held pending until trial 0's jobs both run, so that the two
    overlap by the platform's events, not by chance. One of trial 0's jobs is then cancelled: its launcher ends the
    trial, the sweep records it failed with the launcher's line and starts trial 2 in the freed slot."""
    sweep_file = tmp_path / "psweep.toml"
    sweep_file.write_text(PLATFORM_SWEEP)
    storage = Path(platform["STANDIN_PLATFORM_DIR"]) / "storage" / PROJECT_ID / "results" / "sweeps" / "psweep"
    held = Path(platform["STANDIN_PLATFORM_DIR"]) / "held"
    held.mkdir(parents=True)
    (held / "distributed_training-psweep-t1-0").touch()
    sweep = subprocess.Popen(
        [sys.executable, "-m", "distqa.sweep", str(sweep_file), "--launcher", "platform", "--nodes", "2",
         "--parallel", "2", "--sweep-dir", str(storage), "--trial-sweep-dir", "/project/results/sweeps/psweep",
         "--launcher-args", "--poll 2", "--", *MACHINERY_ARGS],
        cwd=REPO_ROOT, env=platform, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    trial = {n: [f"distributed_training-psweep-t{n}-{rank}" for rank in (0, 1)] for n in (0, 1, 2)}

    def running(keys: list[str]) -> bool:
        seen = events(platform) if (Path(platform["STANDIN_PLATFORM_DIR"]) / "events.jsonl").exists() else []
        return {(key, "running") for key in keys} <= {(e["key"], e["event"]) for e in seen}

    try:
        wait_for(lambda: running(trial[0]), timeout=240)
        (held / trial[1][0]).unlink()
        wait_for(lambda: running(trial[1]), timeout=240)
        subprocess.run(["neuro-flow", "kill", "distributed_training", "psweep-t0-1"], cwd=REPO_ROOT, env=platform,
                       check=True, capture_output=True, timeout=120)
        output = finish(sweep, timeout=600)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    assert sweep.returncode == 0, output
    order = [(e["key"], e["event"]) for e in events(platform)]
    cancelled = order.index((trial[0][1], "cancelled"))
    assert all(order.index((key, "running")) < cancelled for key in trial[0] + trial[1]), "2 trials × 2 jobs at once"
    freed = min(i for i, (key, event) in enumerate(order) if key in trial[0] + trial[1] and event in
                {"cancelled", "succeeded", "failed"})
    assert order.index((trial[2][0], "submitted")) > freed, "a third trial only once a slot is free"
    table = {line.split()[0]: line.split() for line in output.splitlines()
             if line.startswith("trial-") and "failed:" not in line}
    assert table["trial-000"][-2] == "failed" and table["trial-001"][-2] == table["trial-002"][-2] == "done", output
    assert re.search(r"trial-000 failed: node 1 \(distributed_training psweep-t0-1\) cancelled; .* \(exit 1\)",
                     output), output
    for number, steps in ((1, 6), (2, 8)):
        run = json.loads((storage / f"trial-00{number}" / "run.json").read_text())
        assert (run["world_size"], run["nodes"]) == (2, 2)
        assert json.loads((storage / f"trial-00{number}" / "summary.json").read_text())["step"] == steps
