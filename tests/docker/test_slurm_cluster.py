"""scripts/train_slurm.sbatch on a real Slurm 22.05 cluster: a controller and two compute nodes, each a container of
the project's image with Debian's Slurm and munge (tests/docker/slurm.Dockerfile), started once for the session by
tests/docker/slurm_cluster.sh and shared by every test here; jobs go through real ``sbatch``, signals through
``scancel``, requeues through ``scontrol``, and the accounting through ``sacct``.

    tests/docker/run.sh tests/docker/test_slurm_cluster.py      # builds the images, then these tests

Needs Docker and the built images (DISTQA_SLURM_IMAGE, set by tests/docker/run.sh); without them these tests are
skipped. What real Slurm did here that no stand-in showed is written in docs/SLURM.md."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from support.compare import final_weights
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import AT_STEP, RENDEZVOUS

IMAGE = os.environ.get("DISTQA_SLURM_IMAGE", "")
pytestmark = [pytest.mark.docker,
              pytest.mark.skipif(not IMAGE, reason="needs the Slurm image: run `make test-docker`")]

# The run every test trains: 2 ranks of 4 (1 rank of 8 after a lost node: the same global batch), dropout off so
# that a run whose world size changed ends with the uninterrupted run's weights; a stop is agreed at the next step.
TRAINER = [*MACHINERY_ARGS, "--global-batch-size", "8", "--per-rank-batch-size", "4", "--classifier-dropout", "0",
           "--stop-check-every", "1", "--checkpoint-every", "0"]
TRAIN = [*TRAINER, "--max-steps", "12", "--output-dir", "/shared/results"]
PROJECT = "/shared/project"  # the checkout on the shared file system, where jobs are submitted from
HANG_GUARD_S = 240  # a job's own end; the tests wait on Slurm's events, this only ends a hang


@dataclass
class Cluster:
    """The session's cluster: NAME-ctl (slurmctld, where commands run, as on a login node), NAME-node1, -node2."""

    name: str
    shared: Path  # /shared inside every container

    def run(self, *command: str, env: dict[str, str] | None = None, host: str = "ctl",
            timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``command`` on ``host`` from the checkout, ``env`` added (sbatch exports it to the job: --export=ALL)."""
        options = [word for key, value in (env or {}).items() for word in ("--env", f"{key}={value}")]
        result = subprocess.run(["docker", "exec", "--workdir", PROJECT, *options, f"{self.name}-{host}", *command],
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def submit(self, *options: str, env: dict[str, str] | None = None) -> str:
        """``sbatch --parsable OPTIONS`` (the script and its arguments among them): the job id."""
        return self.run("sbatch", "--parsable", *options, env=env).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of the job (JobState, Restarts, ExitCode, NodeList...)."""
        text = self.run("scontrol", "--oneliner", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_state(self, job_id: str, states: set[str], timeout: float = HANG_GUARD_S) -> dict[str, str]:
        """The job's fields once its state is one of ``states`` (scontrol, every second: no sleep decides)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} not {states} in {timeout} s: {fields}\n{self.output(job_id)}")
            time.sleep(1)

    def sacct(self, job_id: str) -> list[list[str]]:
        """sacct's rows of the job and its steps: JobID, State, ExitCode, NodeList (slurmdbd records them a moment
        after the job ends: asked again until the job's last row is final; a resized job has a row per size)."""
        deadline = time.monotonic() + 60
        while True:
            text = self.run("sacct", "--jobs", job_id, "--noheader", "--parsable2",
                            "--format=JobID,State,ExitCode,NodeList").stdout
            rows = [line.split("|") for line in text.splitlines() if line]
            jobs = [row for row in rows if row[0] == job_id]
            if (jobs and jobs[-1][1] not in {"RUNNING", "PENDING", "REQUEUED"}) or time.monotonic() > deadline:
                return rows
            time.sleep(1)

    def wait_end(self, job_id: str) -> dict[str, str]:
        """The job's fields once it has ended (not pending again: a requeued job is PENDING, then RUNNING)."""
        return self.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})

    def output(self, job_id: str) -> str:
        """The job's slurm-<id>.out (the script's #SBATCH --output, in the directory it was submitted from)."""
        path = self.shared / "project" / f"slurm-{job_id}.out"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def results(self, run_id: str) -> Path:
        return self.shared / "results" / run_id


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    shared = tmp_path_factory.mktemp("slurm-shared")
    name = f"distqa-slurm-{uuid.uuid4().hex[:6]}"
    script = str(REPO_ROOT / "tests" / "docker" / "slurm_cluster.sh")
    env = {**os.environ, "DISTQA_SLURM_IMAGE": IMAGE}
    try:
        started = subprocess.run(["bash", script, "up", str(shared), name], capture_output=True, text=True,
                                 timeout=300, env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        (shared / "at_step").mkdir()
        (shared / "at_step" / "at_step.py").write_text(AT_STEP)
        yield Cluster(name, shared)
    finally:
        subprocess.run(["bash", script, "down", name], capture_output=True, timeout=120, env=env, check=False)


def at_step(step: int, flag: Path, **variables: str) -> dict[str, str]:
    """The variables of support.runs.AT_STEP (run as ``--entry-module at_step``): at ``step`` the rank acts
    once, writing ``flag`` on the shared file system first, so the test sees on the host that the run is there."""
    return {"PYTHONPATH": "/shared/at_step:/project", "AT_STEP": str(step), "ACTED_FILE": f"/shared/{flag.name}",
            **variables}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def checkpoint_steps(run_dir: Path) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in sorted((run_dir / "checkpoints").glob("step-*.pt"))]


def wait_for_file(path: Path, cluster: Cluster, job_id: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}: {cluster.job(job_id)}\n{cluster.output(job_id)}"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def uninterrupted(cluster: Cluster) -> Path:
    """``sbatch --nodes 2 scripts/train_slurm.sbatch -- TRAIN``: the run every interrupted one must equal (ended
    by scontrol's state, polled each second: ``sbatch --wait`` polls at growing intervals, up to half a minute)."""
    job_id = cluster.submit("--nodes", "2", "scripts/train_slurm.sbatch", "--", *TRAIN)
    fields = cluster.wait_end(job_id)
    assert fields["JobState"] == "COMPLETED", f"{fields}\n{cluster.output(job_id)}"
    return cluster.results(f"slurm-{job_id}")


def test_sbatch_trains_two_nodes_with_the_ranks_from_slurms_variables(cluster: Cluster, uninterrupted: Path) -> None:
    """Real sbatch reads the script's #SBATCH lines (2 nodes, one task each, 8 CPUs a task), srun starts one task per
    node, each takes its node rank from SLURM_NODEID and the run id from SLURM_JOB_ID; sacct records COMPLETED."""
    job_id = uninterrupted.name.removeprefix("slurm-")
    assert checkpoint_steps(uninterrupted) == [12]
    rows = {row[0]: row[1:] for row in cluster.sacct(job_id)}
    assert rows[job_id][:2] == ["COMPLETED", "0:0"], rows
    assert rows[f"{job_id}.0"] == ["COMPLETED", "0:0", "node[1-2]"], rows  # srun's step: a task on each node
    assert rows[f"{job_id}.batch"][2] == "node1", rows  # the batch script runs on the allocation's first node
    output = cluster.output(job_id)
    assert f"distqa: 2 nodes, master node1:29400, run id slurm-{job_id}" in output, output
    for node in (0, 1):  # SLURM_NODEID 0 is node1's task: the master's
        assert f"worker.sh: run 'slurm-{job_id}': node {node} of 2 at " in output, output
        log = (uninterrupted / "logs" / f"rank-{node}.log").read_text()
        assert f"rank {node} of 2 (node {node}, local rank 0)" in log, log
    assert torch.load(uninterrupted / "checkpoints" / "step-00000012.pt", weights_only=True)["world_size"] == 2


def test_the_script_without_hosts_says_so_as_with_the_stand_in_scontrol(cluster: Cluster) -> None:
    """The case tests/launchers/test_slurm.py runs with a stand-in scontrol, here with the real one: an empty
    SLURM_JOB_NODELIST lists no host (scontrol prints nothing, status 0) and the script says so in one line."""
    result = cluster.run("bash", "scripts/train_slurm.sbatch",
                         env={"SLURM_JOB_NODELIST": "", "SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2"}, check=False)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "distqa: scontrol listed no hosts for SLURM_JOB_NODELIST=''; run this under sbatch\n"


def test_the_doctor_on_the_same_allocation_prints_rank_0s_table(cluster: Cluster) -> None:
    """``sbatch --nodes 2 scripts/train_slurm.sbatch --doctor -- ARGS``: python -m distqa.doctor on every node; rank
    0's table (a row per rank: rank, node) and its verdict in slurm-<id>.out."""
    job_id = cluster.submit("--nodes", "2", "scripts/train_slurm.sbatch", "--doctor", "--", *TRAIN,
                            "--allreduce-mb", "1", "--expect-world-size", "2")
    fields = cluster.wait_end(job_id)
    output = cluster.output(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), output
    table = [line.split()[:2] for line in output.splitlines() if re.match(r"\s*[01]\s+[01]\s", line)]
    assert table == [["0", "0"], ["1", "1"]], output
    assert "all-reduce 1 MB float32 over 2 ranks (gloo)" in output, output
    assert "doctor: all checks passed on 2 rank(s)" in output, output
    assert not (cluster.results(f"slurm-{job_id}") / "checkpoints").exists(), "the doctor trains nothing"


def requeue_and_resume(cluster: Cluster, job_id: str, uninterrupted: Path, stopped_at: int) -> None:
    """``scontrol requeue`` of the ended job (as a preempted one is requeued): the same job id, so the same run id,
    starts again once its credentials expire, resumes from the checkpoint of ``stopped_at`` and ends with the
    uninterrupted run's weights."""
    cluster.run("scontrol", "requeue", job_id)
    fields = cluster.wait_end(job_id)
    output = cluster.output(job_id)
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), output
    run_dir = cluster.results(f"slurm-{job_id}")
    assert f"resumed from /shared/results/slurm-{job_id}/checkpoints/step-{stopped_at:08d}.pt at step {stopped_at} " \
        in (run_dir / "logs" / "rank-0.log").read_text()
    assert checkpoint_steps(run_dir) == [stopped_at, 12]
    difference = max_difference(final_weights(uninterrupted), final_weights(run_dir))
    assert difference < 1e-6, f"the preempted, requeued run differs from the uninterrupted one by {difference:.2e}"


def preempt_at_step(cluster: Cluster, step: int, *options: str, port: int = 29400) -> tuple[str, Path]:
    """A --requeue job of TRAIN whose rank 0 holds ``step`` until a stop signal is there (AT_STEP, AT_WAIT_STOP: no
    clock decides the step the stop lands on); its id and the flag written once the step is reached. ``port``: the
    rendezvous's (MASTER_PORT), one per job running beside another on the same nodes."""
    flag = cluster.shared / f"at-step-{uuid.uuid4().hex[:6]}"
    job_id = cluster.submit("--requeue", "--nodes", "2", *options, "scripts/train_slurm.sbatch", "--entry-module",
                            "at_step", "--", *TRAIN, env={"MASTER_PORT": str(port), **at_step(
                                step, flag, SIGNAL="SIGCONT", TARGET_PID="self", AT_WAIT_STOP="1")})
    return job_id, flag


def assert_stopped_with_a_checkpoint(cluster: Cluster, job_id: str, step: int) -> None:
    """Each node's worker.sh stopped by one SIGTERM at ``step`` with its checkpoint, exit 75; srun and the batch
    script ended with 75 too: the job FAILED with 75 (sacct's rows, the step's included)."""
    fields = cluster.wait_end(job_id)
    output = cluster.output(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "75:0"), output
    for node in (0, 1):
        assert f"worker.sh: run 'slurm-{job_id}' node {node}: stopped by SIGTERM at step {step}, checkpoint " \
            f"/shared/results/slurm-{job_id}/checkpoints/step-{step:08d}.pt written; exit code 75" in output, output
    rows = {row[0]: row[1:3] for row in cluster.sacct(job_id)}
    assert rows[job_id] == rows[f"{job_id}.0"] == ["FAILED", "75:0"], rows
    assert rows[f"{job_id}.1"] == ["COMPLETED", "0:0"], rows  # the batch shell's step that signalled the nodes


def test_a_stop_through_the_batch_shell_checkpoints_the_step_and_the_requeued_job_resumes_exactly(
        cluster: Cluster, uninterrupted: Path) -> None:
    """Two jobs side by side, each with rank 0 holding a step until its signal is there:

    - preemption by hand, ``scancel --batch --signal=TERM`` at step 5: Slurm signals the batch shell alone, which
      sends one SIGTERM to each node's worker.sh (a step of its own, --overlap); the stop is agreed at step 6,
      checkpointed, every task exits 75. ``scontrol requeue`` (what a PreemptMode=REQUEUE partition does) runs it
      again under the same job id, so the same run id: it resumes from step 6 to the uninterrupted weights;
    - the time limit, ``--signal=B:TERM@40`` (the script's own is B:TERM@120) at step 3: once step 3 is held, the
      job's limit is cut to end 1 to 2 minutes on (``scontrol update TimeLimit``; a limit set at submission would race
      the start-up, which takes over a minute on a loaded machine); 40 s before it, up to 60 s earlier, Slurm signals
      the batch shell: the same stop, at step 4, before the limit."""
    timed, timed_flag = preempt_at_step(cluster, 3, "--time", "30", "--signal=B:TERM@40", port=29401)
    job_id, flag = preempt_at_step(cluster, 5)

    def cut_the_limit() -> None:  # as soon as step 3 is held: AT_STEP holds it for 120 s at most
        hours, minutes, _ = (int(part) for part in cluster.job(timed)["RunTime"].split("-")[-1].split(":"))
        cluster.run("scontrol", "update", f"JobId={timed}", f"TimeLimit={hours * 60 + minutes + 2}")

    actions = {flag: lambda: cluster.run("scancel", "--batch", "--signal=TERM", job_id), timed_flag: cut_the_limit}
    deadline = time.monotonic() + HANG_GUARD_S
    while actions:  # each job's action once its step is held, in whichever order they get there
        assert time.monotonic() < deadline, f"{cluster.job(job_id)}\n{cluster.job(timed)}"
        for ready in [path for path in actions if path.exists()]:
            actions.pop(ready)()
        time.sleep(0.2)
    assert_stopped_with_a_checkpoint(cluster, job_id, 6)
    assert "distqa: SIGTERM to the batch shell: one SIGTERM to each node's worker.sh" in cluster.output(job_id)
    assert_stopped_with_a_checkpoint(cluster, timed, 4)
    assert "distqa: SIGTERM to the batch shell: one SIGTERM to each node's worker.sh" in cluster.output(timed)
    requeue_and_resume(cluster, job_id, uninterrupted, stopped_at=6)


def test_scancel_signal_term_to_every_process_of_the_step_stops_with_a_checkpoint(cluster: Cluster) -> None:
    """``scancel --signal=TERM`` (no --batch): what a preemption or a time limit without B: sends, to every process
    of the step at once, the workers and their agents alike; the agents pass theirs on as well, and each worker takes
    that second SIGTERM as the same stop (WORKER_STEP_SIGNALS, distqa.distributed.stop): every task checkpoints the
    step and exits 75."""
    job_id, flag = preempt_at_step(cluster, 5)
    wait_for_file(flag, cluster, job_id)
    cluster.run("scancel", "--signal=TERM", job_id)
    fields = cluster.wait_end(job_id)
    output = cluster.output(job_id)
    assert (fields["JobState"], fields["ExitCode"]) == ("FAILED", "75:0"), output
    for node in (0, 1):  # rank 0 held step 5 until the signal was there: the stop lands at the next step's check
        assert f"worker.sh: run 'slurm-{job_id}' node {node}: stopped by SIGTERM at step 6, checkpoint " \
            f"/shared/results/slurm-{job_id}/checkpoints/step-{6:08d}.pt written; exit code 75" in output, output
    assert "SIGTERM to the batch shell" not in output  # Slurm signalled the step, not the batch shell


SWEEP = """# Two trials of the machinery task, one at a time: the first trains, the second is cancelled by the test.
search = "grid"
seeds = [1]

[fixed]
max_steps = 4

[space]
lr = [1e-3, 3e-3]
"""


def test_a_sweep_runs_its_trials_through_sbatch_wait_and_records_a_cancelled_one_as_failed(cluster: Cluster) -> None:
    """``python -m distqa.sweep FILE --launcher slurm`` on the controller (a login node): each of the two trials is
    one ``sbatch --wait`` of train_slurm.sbatch (job name = its run id); trial-001's job, cancelled by ``scancel``
    once its ranks have started, is recorded failed with sacct's one line (sbatch --wait says nothing)."""
    (cluster.shared / "sweep.toml").write_text(SWEEP)
    sweep_dir = f"/shared/sweeps/{uuid.uuid4().hex[:6]}"
    sweep = subprocess.Popen(
        ["docker", "exec", "--workdir", PROJECT, f"{cluster.name}-ctl", "python", "-m", "distqa.sweep",
         "/shared/sweep.toml", "--launcher", "slurm", "--sweep-dir", sweep_dir, "--", *TRAINER],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S * 2
        cancelled = ""
        # trial-001's job once its ranks run (sbatch --wait may exit 0 for it all the same: the sweep asks sacct)
        started = cluster.shared / sweep_dir.removeprefix("/shared/") / "trial-001" / "logs" / "rank-0.log"
        while not cancelled:
            assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate(timeout=30)[0]
            if started.exists():
                cancelled = cluster.run("squeue", "--noheader", "--name", "sweep-t1", "--format=%i").stdout.strip()
            time.sleep(0.5)
        cluster.run("scancel", cancelled)
        output, _ = sweep.communicate(timeout=HANG_GUARD_S)
    finally:
        sweep.kill()
    assert sweep.returncode == 0, output
    results = (cluster.shared / sweep_dir.removeprefix("/shared/") / "results.txt").read_text()
    rows = {line.split()[0]: line for line in results.splitlines() if line.startswith("trial-")}
    assert "done" in rows["trial-000"] and "failed" in rows["trial-001"], results
    failed = [line for line in results.splitlines() if line.startswith("trial-001 failed: ")]
    assert len(failed) == 1, results
    assert re.fullmatch(rf"trial-001 failed: Slurm job {cancelled}: CANCELLED by 0, exit code \d+:\d+ \(exit \d+\)",
                        failed[0]), results
    states = cluster.run("sacct", "--name", "sweep-t0", "--noheader", "--parsable2", "--allocations",
                         "--format=State").stdout.split()
    assert states == ["COMPLETED"], states


def test_a_lost_node_goes_down_and_the_survivor_finishes_the_run_exactly(cluster: Cluster, uninterrupted: Path) -> None:
    """``sbatch --no-kill`` with ``MIN_NODES=1 EXTERNAL_STORE=1``: node2's container killed while its rank is stopped
    at step 5 (SIGSTOP at AT_STEP: the kill lands mid-run however fast the steps). The survivor (rank 0) saves step
    5, the last it completed, and its agent goes on alone from it with the same global batch (1 rank of 8), to the
    uninterrupted run's weights. Slurm marks node2 DOWN, takes it out of the job (sacct: the 2-node allocation
    RESIZING, the job then COMPLETED on node1), and only then ends the step: srun waits for the lost task until then."""
    flag = cluster.shared / f"lost-{uuid.uuid4().hex[:6]}"
    job_id = cluster.submit("--no-kill", "--nodes", "2", "scripts/train_slurm.sbatch", "--entry-module", "at_step",
                            "--", *TRAIN, env={"MIN_NODES": "1", "EXTERNAL_STORE": "1", **RENDEZVOUS,
                                               **at_step(5, flag, AT_RANK="1", SIGNAL="SIGSTOP", TARGET_PID="self")})
    wait_for_file(flag, cluster, job_id)
    subprocess.run(["docker", "kill", f"{cluster.name}-node2"], capture_output=True, timeout=60, check=True)
    try:
        fields = cluster.wait_end(job_id)
        output = cluster.output(job_id)
        assert "State=DOWN" in cluster.run("scontrol", "--oneliner", "show", "node", "node2").stdout
        assert (fields["JobState"], fields["ExitCode"], fields["NodeList"]) == ("COMPLETED", "0:0", "node1"), output
        rows = [row[:2] + row[3:] for row in cluster.sacct(job_id) if row[0] == job_id]
        assert rows == [[job_id, "RESIZING", "node[1-2]"], [job_id, "COMPLETED", "node1"]], rows
        assert "srun: error: Node failure on node2" in output, output
        assert "rank 0: lost a peer during" in output and "saved step 5 for the resume" in output, output
        run_dir = cluster.results(f"slurm-{job_id}")
        assert checkpoint_steps(run_dir) == [5, 12], output
        # The survivor alone trains the same global batch: its whole share, in two micro-batches (elastic.split_line).
        assert "world size 1, global batch 8 = shares of 8 per rank × 1 ranks, 2 micro-batches of 4" in \
            (run_dir / "logs" / "rank-0.log").read_text()
        difference = max_difference(final_weights(uninterrupted), final_weights(run_dir))
        assert difference < 1e-6, f"the run that lost node2 differs from the uninterrupted one by {difference:.2e}"
    finally:  # node2 back for whatever runs next: its slurmd registers again and ReturnToService=2 makes it idle
        subprocess.run(["docker", "start", f"{cluster.name}-node2"], capture_output=True, timeout=60, check=False)
