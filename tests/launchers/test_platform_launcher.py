"""The platform launcher's logic (distqa.launch.platform) called as functions, no process started: job names as
neuro-flow builds them, the status rows of the platform client, the options and their sources, and the run's
decisions (start, watch, resubmit, give up) against a scripted flow CLI. tests/distributed/test_platform.py runs the
launcher against the stand-in platform; these cases are each of its branches, in milliseconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distqa.launch.platform import kill
from distqa.launch.platform.jobs import (
    JOB,
    STORE_JOB,
    Flow,
    JobStatus,
    Listing,
    job_name,
    parse_listing,
    parse_status,
    valid_job_name,
)
from distqa.launch.platform.options import Options, UsageError, parse_options
from distqa.launch.platform.run import UNKNOWN_LIMIT, Launch, RunFailedError, Watch

from support.processes import clean_env
from support.repo import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
import platform_cli  # the stand-in (tests/standin is not a package), derived from neuro-flow's source

# --- job names -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("project", ["distqa", "my_project", "-a__b-", "a" * 60, "x"])
@pytest.mark.parametrize(("job_id", "suffix"), [(JOB, "dq-0612-1-0"), (JOB, "r_1-10"), (STORE_JOB, "dq-0612"),
                                                (JOB, "a" * 40), ("train", "--x--")])
def test_job_names_are_built_as_neuro_flow_builds_them_and_checked_as_the_platform_checks_them(
        project: str, job_id: str, suffix: str) -> None:
    """The stand-in's job_name follows apolo_flow.live_runner.LiveExecutor.run line by line; the validity rule is
    apolo_cli.click_types.JOB_NAME's own."""
    from apolo_cli.click_types import JOB_NAME

    name = job_name(project, job_id, suffix)
    assert name == platform_cli.job_name(project, job_id, suffix)
    try:
        JOB_NAME.convert(name, None, None)
        platform_takes_it = True
    except ValueError:
        platform_takes_it = False
    assert valid_job_name(name) == platform_takes_it, name


# --- the status rows ---------------------------------------------------------------------------------------------

# `apolo status` as apolo_cli.formatters.jobs.JobStatusFormatter prints it (rows of a rich table, coloured on a
# terminal); "Internal Hostname Named" is a row of its own, not the hostname.
FAILED = """\
 Job                      job-0b8f3c1e-5a3d-4f1e-9a6b-2b7c9d0e1f2a
 Name                     distqa-distributed-training-r-1
 Tags                     run:r
 Owner                    someone
 Status                   \x1b[31mfailed\x1b[0m (OOMKilled)
 Exit code                137
 Internal Hostname        job-0b8f3c1e.platform-jobs
 Internal Hostname Named  distqa-distributed-training-r-1--someone.platform-jobs
"""


def test_the_status_is_read_from_the_platform_clients_rows() -> None:
    status = parse_status(FAILED)
    assert status == JobStatus("failed", "job-0b8f3c1e.platform-jobs", "job-0b8f3c1e-5a3d-4f1e-9a6b-2b7c9d0e1f2a",
                               "exit code 137 (OOMKilled)")
    assert status.ended and status.describe() == "failed: exit code 137 (OOMKilled)"
    pending = parse_status(" Job                      job-1\n Status                   pending (ContainerCreating)\n")
    assert (pending.state, pending.host, pending.how, pending.ended) == ("pending", "", "(ContainerCreating)", False)
    running = parse_status(" Job   job-2\n Status   running\n Internal Hostname   10.0.0.7\n")
    assert (running.state, running.host, running.describe()) == ("running", "10.0.0.7", "running")
    assert parse_status("Job distributed_training is not running\n").state == "unknown"
    assert parse_status("").state == "unknown"


# --- the listing: `<flow> ps` as the installed CLI prints it --------------------------------------------------------

PS_TABLE = r"""
import asyncio, io, json, sys, types
from datetime import datetime, timedelta, timezone
from apolo_flow.live_runner import LiveRunner
from apolo_sdk import JobStatus
from rich.console import Console
sys.path.insert(0, sys.argv[1])
import platform_cli  # its _Client: the project and the parser neuro-flow's config loader asks for, nothing more
width, encoding, terminal, jobs = int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1", json.loads(sys.argv[5])
now = datetime.now(timezone.utc)

class Jobs:  # apolo_sdk.Jobs.list over `jobs` (oldest first), with the filters LiveRunner._resolve_jobs passes
    async def list(self, *, tags=(), statuses=(), reverse=False, limit=None, **_):
        found = [j for j in jobs if set(tags) <= set(j["tags"]) and JobStatus(j["status"]) in statuses]
        for j in (found[::-1] if reverse else found)[:limit]:
            at = now - timedelta(seconds=j["age"])
            yield types.SimpleNamespace(id=j["id"], status=JobStatus(j["status"]), tags=j["tags"],
                                        history=types.SimpleNamespace(created_at=at, started_at=at, finished_at=at))

class Client(platform_cli._Client):
    jobs = Jobs()

out = io.TextIOWrapper(io.BytesIO(), encoding=encoding, newline="")
console = Console(file=out, width=width, force_terminal=terminal, highlight=False, log_path=False)
runner = LiveRunner(platform_cli.workspace(), console, Client(), None, types.SimpleNamespace(verbosity=0,
                    show_traceback=False))

async def main():
    await runner.init_flow()
    for j in jobs:  # each job's tags as neuro-flow gives them: the job's meta tags, and multi:SUFFIX
        j["tags"] = sorted((await runner.flow.get_meta(j["job"])).tags | ({f"multi:{j['suffix']}"} if j["suffix"]
                                                                         else set()))
    await runner.ps()
    await runner.close()

asyncio.run(main())
out.flush()
sys.stdout.write(out.buffer.getvalue().decode(encoding))
"""
FLOW26_PYTHON = REPO_ROOT / ".venv-apolo-flow26" / "bin" / "python"
RID = "job-00000000-0000-4000-8000-0000000000"
PS_JOBS = [  # oldest first; node 1 failed (job a1) and was submitted again (a2, running): the listing shows a2
    {"job": JOB, "suffix": "dq-0612-0", "status": "running", "id": RID + "00", "age": 300},
    {"job": JOB, "suffix": "dq-0612-1", "status": "failed", "id": RID + "a1", "age": 290},
    {"job": JOB, "suffix": "dq-0612-1", "status": "running", "id": RID + "a2", "age": 20},
    {"job": JOB, "suffix": "dq-0612-2", "status": "pending", "id": RID + "02", "age": 10},
    {"job": JOB, "suffix": "dq-0612-3", "status": "succeeded", "id": RID + "03", "age": 3000},
    {"job": JOB, "suffix": "old-0", "status": "cancelled", "id": RID + "99", "age": 90000},
    {"job": STORE_JOB, "suffix": "dq-0612", "status": "running", "id": RID + "st", "age": 400},
    {"job": "jupyter", "suffix": "", "status": "running", "id": RID + "ju", "age": 5},
]


def real_ps(python: Path | str, width: int = 4096, encoding: str = "utf-8", terminal: bool = False) -> str:
    """What the installed CLI's `ps` (apolo_flow.live_runner.LiveRunner.ps, its own code) prints for PS_JOBS."""
    result = subprocess.run([str(python), "-c", PS_TABLE, str(REPO_ROOT / "tests" / "standin"), str(width), encoding,
                             "1" if terminal else "0", json.dumps(PS_JOBS)], cwd=REPO_ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("python", [sys.executable, FLOW26_PYTHON], ids=["neuro-flow-24.12", "apolo-flow-26.7"])
def test_the_listing_is_read_from_the_real_clis_ps_table(python: Path | str) -> None:
    """Every job's state and id from the table the installed `ps` prints (neuro-flow 24.12 and apolo-flow 26.7): the
    newest job of each suffix, a live one first; the same whether the console draws its box in Unicode, in ASCII (an
    encoding that is not UTF-8) or in colour (a terminal)."""
    want = {(JOB, "dq-0612-0"): JobStatus("running", job_id=RID + "00"),
            (JOB, "dq-0612-1"): JobStatus("running", job_id=RID + "a2"),
            (JOB, "dq-0612-2"): JobStatus("pending", job_id=RID + "02"),
            (JOB, "dq-0612-3"): JobStatus("succeeded", job_id=RID + "03"),
            (JOB, "old-0"): JobStatus("cancelled", job_id=RID + "99"),
            (STORE_JOB, "dq-0612"): JobStatus("running", job_id=RID + "st"),
            ("jupyter", ""): JobStatus("running", job_id=RID + "ju")}
    for variant in ({}, {"encoding": "ascii"}, {"terminal": True}):
        printed = real_ps(python, **variant)  # type: ignore[arg-type]
        listing = parse_listing(printed)
        assert listing.error == "", (variant, printed)
        never_run = {key for key, status in listing.jobs.items() if status == JobStatus("unknown")}
        assert {key: status for key, status in listing.jobs.items() if key not in never_run} == want, printed
        assert ("train", "") in never_run and listing.status(JOB, "dq-0612-9") == JobStatus("unknown")
    if python == sys.executable:  # the ASCII box and the colours are there to be read past
        assert "|" in real_ps(python, encoding="ascii") and "\x1b[" in real_ps(python, terminal=True)


def test_a_listing_it_cannot_read_says_why_and_reads_nothing() -> None:
    """At rich's 80 columns (no $COLUMNS, not a terminal) the table wraps its rows: refused, not misread; so are
    an error, an empty output and a row cut short."""
    wrapped = parse_listing(real_ps(sys.executable, width=80))
    assert wrapped.jobs == {} and wrapped.error.startswith("a row it cannot read: ")
    assert parse_listing("ERROR: Config is not a regular file\n") == Listing(
        {}, "no JOB | STATUS | RAW ID | WHEN table in its output (ERROR: Config is not a regular file)")
    assert parse_listing("").error == "no JOB | STATUS | RAW ID | WHEN table in its output (none)"
    header = "  JOB   \u2502 STATUS  \u2502 RAW ID \u2502 WHEN\n"
    assert parse_listing(header + "  train \u2502 running \u2502 job-1\n").error == \
        "a row it cannot read: 'train \u2502 running \u2502 job-1'"
    assert parse_listing(header + "  train \u2502 weird \u2502 job-1 \u2502 now\n").error.startswith("a row it cannot")
    assert parse_listing(header + "  train \u2502 running \u2502 job-1\u2026 \u2502 now\n").error.startswith("a row it")


# --- options -----------------------------------------------------------------------------------------------------

def options(*argv: str, **environ: str) -> Options:
    parsed = parse_options(argv, {"ENV_FILE": "", **environ})
    assert parsed is not None
    return parsed


def test_options_come_from_flags_then_the_environment_then_dotenv_then_defaults(tmp_path: Path) -> None:
    dotenv = tmp_path / "launch.env"
    dotenv.write_text("NODES=4\nPLATFORM_PRESET='gpu-a'  # quoted\nEXTERNAL_STORE=1\nMIN_NODES=\nRUN_ID=not-read\n")
    o = options(ENV_FILE=str(dotenv))
    assert (o.nodes, o.min_nodes, o.preset, o.external_store, o.store_preset) == (4, 4, "gpu-a", True, "cpu-small")
    assert o.run_id.startswith("dq-"), "RUN_ID comes from the environment alone"
    o = options("--nodes", "3", "--min-nodes", "2", ENV_FILE=str(dotenv), NODES="5", PLATFORM_PRESET="",
                RUN_ID="from-env", SCHEDULE_TIMEOUT="60", POLL_INTERVAL="0.5")
    assert (o.nodes, o.min_nodes, o.preset, o.run_id, o.timeout_s, o.poll_s) == (3, 2, "gpu-a", "from-env", 60, 0.5)
    assert o.elastic and o.join_timeout_s == 360
    o = options("--run-id", "r", "--", "--help", "--nodes", "9")
    assert (o.nodes, o.trainer_args) == (2, ["--help", "--nodes", "9"]), "after --, everything is the trainer's"
    assert parse_options(["--nodes", "3", "--help"], {}) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes"], "--nodes needs a value (see --help)"),
    (["--preset", ""], "--preset needs a value (see --help)"),
    (["--bogus"], "unknown option '--bogus'; trainer flags go after -- (see --help)"),
    (["stray"], "unknown option 'stray'"),
    (["--nodes", "2", "--min-nodes", "3"], "--min-nodes must be in 1..2 (--nodes), got 3"),
    (["--max-resubmits", "-1"], "max_resubmits must be a whole number, got '-1'"),
    (["--max-resubmits", "x"], "max_resubmits must be a whole number, got 'x'"),
    (["--poll", "1.x"], "--poll must be a number of seconds, got '1.x'"),
    (["--port", "80"], "--port must be in 1024..65535, got 80"),
    (["--run-id", "A_b"], "--run-id must be lowercase letters and digits"),
    (["--life-span", "1h1d"], "--life-span must be [Nd][Nh][Nm][Ns] in that order"),
])
def test_a_bad_option_is_one_line_naming_it(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_options(argv, {})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_an_env_file_that_names_no_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"ENV_FILE=.*missing\.env: no such file"):
        parse_options([], {"ENV_FILE": str(tmp_path / "missing.env")})


# --- the run's decisions -----------------------------------------------------------------------------------------

def failed(job_id: str, how: str = "exit code 137 (Error)") -> JobStatus:
    return JobStatus("failed", "h", job_id, how)


def test_without_a_range_any_ended_job_ends_the_run_every_ended_node_named() -> None:
    watch = Watch(options("--nodes", "3", "--run-id", "r"), "neuro-flow")
    decisions = watch.decide({1: failed("job-1"), 2: JobStatus("cancelled", "h", "job-2")}, succeeded=0)
    assert [(d.action, d.rank) for d in decisions] == [("report", 1), ("fail", 2)]
    assert decisions[0].line == ("node 1 (distributed_training r-1) failed; its logs: 'neuro-flow logs "
                                 "distributed_training r-1'")
    assert decisions[1].line.startswith("node 2 (distributed_training r-2) cancelled; its logs")
    assert watch.decide({}, succeeded=1) == [] and not watch.finished(1) and watch.finished(3)


def test_with_a_range_a_lost_node_is_resubmitted_up_to_the_bound_then_left_out() -> None:
    watch = Watch(options("--nodes", "3", "--min-nodes", "1", "--max-resubmits", "2", "--run-id", "r"), "apolo-flow")
    for count, job_id in ((1, "job-a"), (2, "job-b")):
        [decision] = watch.decide({2: failed(job_id)}, succeeded=0)
        assert (decision.action, decision.rank) == ("resubmit", 2)
        assert decision.line == (f"node 2 (job {job_id}, distributed_training r-2) failed: exit code 137 (Error); "
                                 f"resubmitting it ({count} of 2); the others go on (--min-nodes 1)")
    [decision] = watch.decide({2: failed("job-c", "exit code 125 (not scheduled)")}, succeeded=0)
    assert decision.action == "lose" and watch.lost == {2}
    assert decision.line == ("node 2 (job job-c, distributed_training r-2) failed: exit code 125 (not scheduled); "
                             "submitted again 2 time(s) (--max-resubmits): the others go on without it (--min-nodes "
                             "1); its logs: 'apolo-flow logs distributed_training r-2'")
    assert not watch.finished(1) and watch.finished(2), "the run ends when all but the lost have succeeded"


def test_node_0_hosting_the_store_is_never_resubmitted_but_with_an_external_store_it_is() -> None:
    on_node_0 = Watch(options("--nodes", "2", "--min-nodes", "1", "--run-id", "r"), "neuro-flow")
    [decision] = on_node_0.decide({0: failed("job-0")}, succeeded=0)
    assert decision.action == "lose" and decision.line.endswith(
        "the others go on (--min-nodes 1); node 0 hosts the rendezvous store: not submitted again")
    apart = Watch(options("--nodes", "2", "--min-nodes", "1", "--external-store", "--run-id", "r"), "neuro-flow")
    assert [d.action for d in apart.decide({0: failed("job-0")}, succeeded=0)] == ["resubmit"]


def test_a_node_lost_after_another_finished_is_not_resubmitted_and_fewer_than_min_nodes_end_the_run() -> None:
    watch = Watch(options("--nodes", "3", "--min-nodes", "2", "--run-id", "r"), "neuro-flow")
    [decision] = watch.decide({1: failed("job-1")}, succeeded=1)
    assert decision.action == "lose" and "the run has finished on another node: not submitted again" in decision.line
    assert [d.action for d in watch.decide({2: failed("job-2")}, succeeded=0)] == ["fail"], "1 left, 2 needed"


def test_statuses_unread_twenty_times_in_a_row_end_the_run() -> None:
    watch = Watch(options("--run-id", "r"), "neuro-flow")
    for _ in range(UNKNOWN_LIMIT - 2):
        watch.count_unknown(1)
    watch.count_unknown(0)  # one good look starts the count again
    for _ in range(UNKNOWN_LIMIT - 1):
        watch.count_unknown(2)
    with pytest.raises(RunFailedError, match=r"the status of 2 job\(s\) could not be read 20 times in a row"):
        watch.count_unknown(2)


# --- the run against a scripted flow CLI -----------------------------------------------------------------------

@dataclass
class Submitted:
    """A `<flow> run` whose exit status is known in advance: None while it waits for its job."""

    codes: Iterator[int | None]
    returncode: int | None = None

    def poll(self) -> int | None:
        self.returncode = next(self.codes, self.returncode)
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            pass
        return self.returncode or 0


@dataclass
class ScriptedFlow(Flow):
    """The flow CLI of one launch, its statuses played from a script: {(job, suffix): [status, ...]} (the last one
    stays); every command it was given, in order."""

    script: dict[tuple[str, str], list[JobStatus]] = field(default_factory=dict)
    run_codes: list[int | None] = field(default_factory=lambda: [0])
    given: list[str] = field(default_factory=list)

    def status(self, job_id: str, suffix: str) -> JobStatus:
        played = self.script[job_id, suffix]
        return played.pop(0) if len(played) > 1 else played[0]

    def listing(self) -> Listing:
        """One look at every job of the script (the next status of each), as one `ps`."""
        self.given.append("ps")
        return Listing({key: self.status(*key) for key in self.script})

    def describe(self, job_id: str, suffix: str, listed: JobStatus) -> JobStatus:
        """The scripted statuses say how a job ended already: the call is recorded, the status kept."""
        self.given.append(f"status {job_id} {suffix}")
        return listed

    def submit(self, command: list[str]) -> Submitted:  # type: ignore[override]
        self.given.append(f"run {command[2]} {command[4]}")
        return Submitted(iter(self.run_codes))

    def kill(self, job_id: str, suffix: str) -> bool:
        self.given.append(f"kill {job_id} {suffix}")
        return True


def scripted(*argv: str, **script: list[JobStatus]) -> ScriptedFlow:
    """A launch of ``argv`` (polling at once) whose jobs say what ``script`` says, keyed by suffix."""
    o = options("--run-id", "r", "--poll", "0", *argv)
    keyed = {(STORE_JOB if suffix == "r" else JOB, suffix.replace("_", "-")): played for suffix, played in
             script.items()}
    return ScriptedFlow("neuro-flow", o, REPO_ROOT, script=keyed)


RUNNING = JobStatus("running", "10.0.0.1", "job-m")
PENDING = JobStatus("pending")


@pytest.mark.parametrize(("played", "run_codes", "message"), [
    ([PENDING, JobStatus("failed", "", "job-m", "(not scheduled)")], [None, 125],
     "the master job (distributed_training r-0) was not started within 900 s; is preset 'gpu-small' available"),
    ([PENDING, failed("job-m")], [None, 137], "the master job failed before the other jobs started; see "
                                              "'neuro-flow logs distributed_training r-0'"),
    ([JobStatus("cancelled", "h", "job-m")], [None], "the master job ended (cancelled) before the other jobs"),
    ([PENDING], [None, 1], "could not start the master job: 'neuro-flow run distributed_training --suffix r-0 ...' "
                           "failed (see above)"),
])
def test_the_master_that_does_not_run_stops_the_launch_saying_why(
        played: list[JobStatus], run_codes: list[int | None], message: str) -> None:
    flow = scripted(r_0=played)
    flow.run_codes = run_codes
    launch = Launch(flow)
    with pytest.raises(RunFailedError) as failure:
        launch.wait_running("the master job", JOB, "r-0", launch.start_node(0, ""), "gpu-small")
    assert message in str(failure.value)
    assert launch.started == ["r-0"], "what was submitted is killed"


def test_the_master_runs_once_it_has_a_hostname() -> None:
    flow = scripted(r_0=[PENDING, JobStatus("running"), RUNNING])
    flow.run_codes = [None, None, 0]
    launch = Launch(flow)
    assert launch.wait_running("the master job", JOB, "r-0", launch.start_node(0, ""), "gpu-small") == "10.0.0.1"
    assert launch.submitting == []


def test_the_watch_resubmits_a_lost_node_waits_for_its_new_job_and_ends_when_all_succeeded(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Node 1 fails (job-1); its new job is submitted, and while that `run` waits the platform still shows job-1:
    not a second loss. The new job runs, then both succeed."""
    lost = failed("job-1")
    flow = scripted("--nodes", "2", "--min-nodes", "1",
                    r_0=[RUNNING, RUNNING, RUNNING, JobStatus("succeeded", "h", "job-m")],
                    r_1=[lost, lost, JobStatus("running", "h", "job-1b"), JobStatus("succeeded", "h", "job-1b")])
    flow.run_codes = [None, None, 0]
    launch = Launch(flow)
    launch.watch("10.0.0.1")
    assert flow.given == ["ps", "status distributed_training r-1", "run distributed_training r-1", "ps", "ps", "ps"], \
        "one listing a look; status once, for the job that ended; submitted again once"
    assert launch.started == ["r-1"]
    assert capsys.readouterr().err.count("resubmitting it (1 of 3)") == 1


def test_the_store_ending_ends_the_run_in_one_line() -> None:
    flow = scripted("--nodes", "2", "--min-nodes", "1", "--external-store", r=[failed("job-s")], r_0=[RUNNING],
                    r_1=[RUNNING])
    with pytest.raises(RunFailedError) as failure:
        Launch(flow).watch("10.0.0.9")
    assert str(failure.value).startswith("the rendezvous store's job (rendezvous_store r, job job-s) ended: failed: "
                                         "exit code 137 (Error); every node's rendezvous is gone with it")
    assert flow.given == ["ps", "status rendezvous_store r"], "one listing, then how the store's job ended"


def test_a_listing_it_cannot_read_is_every_job_unknown_said_once_and_counted(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A `ps` whose output is no table (an error, a changed format) is not a success nor a crash: every status is
    unknown, the reason one line (once while it stays the same), and UNKNOWN_LIMIT such looks end the run."""
    flow = scripted("--nodes", "2", r_0=[RUNNING], r_1=[RUNNING])
    unreadable = Listing({}, "'neuro-flow ps': no JOB | STATUS | RAW ID | WHEN table in its output (ERROR: offline)")
    monkeypatch.setattr(flow, "listing", lambda: unreadable)
    with pytest.raises(RunFailedError, match=r"the status of 2 job\(s\) could not be read 20 times in a row"):
        Launch(flow).watch("10.0.0.1")
    said = [line for line in capsys.readouterr().err.splitlines() if "could not read the jobs' statuses" in line]
    assert said == ["[platform] could not read the jobs' statuses: 'neuro-flow ps': no JOB | STATUS | RAW ID | WHEN "
                    "table in its output (ERROR: offline); every job's status is unknown this time (the run is "
                    "given up after 20 such looks in a row)"]


def test_killing_the_run_kills_every_node_then_the_store(capsys: pytest.CaptureFixture[str]) -> None:
    flow = scripted("--nodes", "2", "--external-store")
    launch = Launch(flow, started=["r-0", "r-1"], store_started=True)
    launch.kill_all()
    assert flow.given == ["kill distributed_training r-0", "kill distributed_training r-1", "kill rendezvous_store r"]
    assert "[platform] killing rendezvous_store r (the rendezvous store)" in capsys.readouterr().err


def test_kill_distributed_kills_every_node_then_the_store_and_fails_when_a_kill_did(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/kill_distributed.sh's module against a flow CLI that records its commands and fails to kill r-1."""
    calls = tmp_path / "calls"
    cli = tmp_path / "neuro-flow"
    cli.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$3" != r-1 ]\n')
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    environ = {**os.environ, "FLOW_CLI": "neuro-flow", "ENV_FILE": "", "NODES": "3"}
    assert kill.main(["--run-id", "r"], environ, tmp_path) == 1
    assert calls.read_text().splitlines() == ["kill distributed_training r-0", "kill distributed_training r-1",
                                              "kill distributed_training r-2", "kill rendezvous_store r"]
    assert "[platform] could not kill distributed_training r-1: run 'neuro-flow kill distributed_training r-1'" in \
        capsys.readouterr().err
    assert kill.main(["--all"], environ, tmp_path) == 0 and calls.read_text().splitlines()[-1] == "kill ALL"
    assert kill.main(["--nodes", "2"], environ, tmp_path) == 2
    assert capsys.readouterr().err == ("kill_distributed.sh: name the run with --run-id ID (the launcher printed it), "
                                       "or pass --all\n")
