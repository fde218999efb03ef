"""The platform's side of a launch: the name each job gets, the flow CLI's commands, and the status it prints.

Nothing here decides anything about a run (:mod:`distqa.launch.platform.run` does): these are the facts of
neuro-flow / apolo-flow (both ship the package ``apolo_flow``) and of the platform client they call, each citing
the function it follows, so that the launcher refuses before submitting what the platform would refuse after.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distqa.launch.platform.options import Options

JOB = "distributed_training"
"""The job of .neuro/live.yml that runs one node: ``run distributed_training --suffix <run id>-<node rank>``."""
STORE_JOB = "rendezvous_store"
"""The job of .neuro/live.yml that runs python -m distqa.launch.rendezvous_store (--external-store)."""
EX_PLATFORMERROR = 125
"""`<flow> run` ends with the exit status of `apolo run` (apolo_flow.utils.run_subproc), which returns at its first
look at the job after it left pending (apolo_cli.job.run_job): for a job that has already ended, with the job's own
exit code, or with EX_PLATFORMERROR (apolo_cli.const) for one that failed without one: the platform never started
it."""
JOB_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
"""What `apolo run --name` accepts, 3..40 characters long (apolo_cli.click_types.JOB_NAME)."""
JOB_NAME_LENGTH = range(3, 41)
ENDED = ("succeeded", "failed", "cancelled")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
PS_HEADER = ["JOB", "STATUS", "RAW ID", "WHEN"]
"""The columns of `<flow> ps` (apolo_flow.live_runner.LiveRunner.ps: a rich Table, box MINIMAL_HEAVY_HEAD; the same in
neuro-flow 24.12 and apolo-flow 26.7)."""
PS_STATES = ("unknown", "pending", "running", "succeeded", "failed", "cancelled", "skipped", "cached")
"""What its STATUS column holds: the values of apolo_flow.types.TaskStatus (TaskStatus.__rich__ prints the value)."""
PS_CELL = re.compile(r"[\u2502|]")
"""A column rule: the box's vertical line, or ASCII's "|" when the console's encoding is not UTF-8 (rich.box
substitutes box.ASCII then)."""
PS_COLUMNS = "4096"
"""$COLUMNS for `<flow> ps`: its rich Console takes its width from COLUMNS, else 80 columns when its output is not a
terminal (rich.console.Console.size), and would wrap a 40-character job id over two lines; the table is never wider
than its cells (Table.expand is off)."""


class FlowMissingError(Exception):
    """No flow CLI to run: the line says how to install one."""


def _collapse(text: str) -> str:
    text = text.replace("_", "-").strip("-")
    while "--" in text:
        text = text.replace("--", "-")
    return text


def job_name(project_id: str, job_id: str, suffix: str) -> str:
    """The platform name of the job `run JOB_ID --suffix SUFFIX`, built as neuro-flow builds it in
    ``apolo_flow.live_runner.LiveExecutor.run`` (inline there, so not importable): the project id, ``-``, then job id
    and suffix with ``_`` as ``-``, the project id cut so that the whole is at most 40 characters."""
    second = _collapse(f"{job_id}-{suffix}")
    name = _collapse(project_id)[: 40 - len(second) - 1] + "-" + second
    while "--" in name:
        name = name.replace("--", "-")
    return name


def valid_job_name(name: str) -> bool:
    """Whether `apolo run` takes ``name`` (apolo_cli.click_types.JobNameType.convert)."""
    return len(name) in JOB_NAME_LENGTH and JOB_NAME.fullmatch(name) is not None


def project_id(repo_root: Path) -> str:
    """The ``id:`` of the project.yml neuro-flow reads: ``.apolo/`` before ``.neuro/`` (apolo_flow.parser.
    find_workspace); an empty string when there is none."""
    config = repo_root / (".apolo" if (repo_root / ".apolo").is_dir() else ".neuro") / "project.yml"
    text = config.read_text() if config.is_file() else ""
    found = re.search(r"^id:[ \t]*([A-Za-z0-9_-]*)", text, re.MULTILINE)
    return found[1] if found else ""


@dataclass(frozen=True)
class JobStatus:
    """What `<flow> status JOB SUFFIX` says of one job."""

    state: str
    """pending, running, succeeded, failed, cancelled; "unknown" when the job cannot be found or the output read."""
    host: str = ""
    """Its Internal Hostname, once it has one."""
    job_id: str = ""
    """The platform's id of the job (job-…): a job submitted again under the same name has a new one."""
    how: str = ""
    """How it ended as far as the platform says: "exit code 137 (OOMKilled)", "(reason)", or empty."""

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def describe(self) -> str:
        """The state and how it ended: "failed: exit code 137 (Error)", or "cancelled"."""
        return f"{self.state}: {self.how}" if self.how else self.state


def parse_status(output: str) -> JobStatus:
    """The job in `<flow> status`'s output: the platform's job table (apolo_cli.formatters.jobs.JobStatusFormatter),
    one row per field: ``Job``, ``Status`` with the reason in parentheses, ``Exit code`` and ``Internal Hostname``.
    `apolo status` has no machine-readable output (its only option is --full-uri) and neuro-flow's
    ``LiveExecutor.status`` passes none, so the rows are read as words; colours are dropped first."""
    state = host = job_id = code = reason = ""
    for line in ANSI.sub("", output).splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "Status" and len(words) > 1 and not state:
            state = words[1]
            found = re.fullmatch(r" *Status +[a-z]* *\((.*)\) *", line)
            reason = found[1] if found else ""
        elif words[:2] == ["Internal", "Hostname"] and len(words) == 3 and not host:
            host = words[2]
        elif words[0] == "Job" and len(words) == 2 and not job_id:
            job_id = words[1]
        elif words[:2] == ["Exit", "code"] and len(words) == 3 and not code:
            code = words[2]
    how = " ".join(part for part in (f"exit code {code}" if code else "", f"({reason})" if reason else "") if part)
    return JobStatus(state or "unknown", host, job_id, how)


@dataclass(frozen=True)
class Listing:
    """What one `<flow> ps` says of the flow's jobs: the state and id of every job it lists, keyed by (job id,
    suffix) (suffix "" for a job that is not a multi job), or why its output could not be read."""

    jobs: dict[tuple[str, str], JobStatus]
    error: str = ""
    """Why the listing could not be read (every job's status is then unknown); empty when it was."""

    def status(self, job_id: str, suffix: str) -> JobStatus:
        """The job's state and id; "unknown" when the listing does not show it (or could not be read)."""
        return self.jobs.get((job_id, suffix), JobStatus("unknown"))


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line[:1] in ("|", "\u2502") and line[-1:] in ("|", "\u2502"):  # box.ASCII draws the table's outer edges too
        line = line[1:-1]
    return [cell.strip() for cell in PS_CELL.split(line)]


def parse_listing(output: str) -> Listing:
    """The jobs in `<flow> ps`'s output (apolo_flow.live_runner.LiveRunner.ps, through LiveRunner._job_status): a
    table of JOB ("JOB_ID" or "JOB_ID SUFFIX" for each suffix of a multi job, the newest job under that name: a live
    one before any that ended), STATUS, RAW ID (the platform's job id, N/A for a job never run) and WHEN. It has no
    machine-readable form (`ps` takes no option), so the cells are read between the column rules, colours dropped
    first. Strict: without the header, or with a row that is not four cells with a known status, nothing is read and
    :attr:`Listing.error` says why."""
    lines = ANSI.sub("", output).splitlines()
    header = next((i for i, line in enumerate(lines) if _cells(line) == PS_HEADER), None)
    if header is None:
        first = next((line.strip() for line in lines if line.strip()), "")
        return Listing({}, f"no {' | '.join(PS_HEADER)} table in its output ({first[:160] or 'none'})")
    jobs: dict[tuple[str, str], JobStatus] = {}
    for line in lines[header + 1:]:
        if not any(char.isalnum() for char in line):  # the rules under the header and at the bottom
            continue
        cells = _cells(line)
        names = cells[0].split() if len(cells) == 4 else []
        # A cell cut short ("…": too narrow a console) would give a wrong job id: refused like a row that wrapped.
        if len(names) not in (1, 2) or cells[1] not in PS_STATES or not cells[2] or "\u2026" in line:
            return Listing({}, f"a row it cannot read: '{line.strip()[:160]}'")
        job_id, suffix = names[0], names[1] if len(names) == 2 else ""
        jobs.setdefault((job_id, suffix), JobStatus(cells[1], job_id="" if cells[2] == "N/A" else cells[2]))
    return Listing(jobs)


def find_flow_cli(environ: Mapping[str, str]) -> str:
    """$FLOW_CLI if set, else apolo-flow (the current name), else neuro-flow (the old name): for the launcher and for
    scripts/kill_distributed.sh (:mod:`distqa.launch.platform.kill`)."""
    named = environ.get("FLOW_CLI")
    path = environ.get("PATH")
    if named:
        if shutil.which(named, path=path) is None:
            raise FlowMissingError(f"FLOW_CLI={named} is not on PATH")
        return named
    for name in ("apolo-flow", "neuro-flow"):
        if shutil.which(name, path=path):
            return name
    raise FlowMissingError("neither apolo-flow nor neuro-flow is on PATH: 'make setup' installs it into .venv (then "
                       "'source .venv/bin/activate'), or 'pip install neuro-flow'; log in with 'apolo login'")


def _sigint_ignored() -> None:
    # As bash starts a background command: a terminal's Ctrl-C reaches the launcher, which stops the CLI itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass
class Flow:
    """The flow CLI's commands for one launch, run in the repository (the CLI finds .neuro/live.yml from its working
    directory up: apolo_flow.parser.find_workspace)."""

    cli: str
    options: Options
    repo_root: Path

    def suffix(self, rank: int) -> str:
        return f"{self.options.run_id}-{rank}"

    def node_command(self, rank: int, master: str) -> list[str]:
        """The command that starts node ``rank``'s job, pointed at ``master`` (empty on node 0 without a store). The
        trainer flags travel as one param, split again by neuro-flow as a shell would (shlex), so each is quoted."""
        o = self.options
        params = {"nodes": o.nodes, "min_nodes": o.min_nodes, "node_rank": rank, "master_addr": master,
                  "master_port": o.port, "external_store": "true" if o.external_store else "false",
                  "run_id": o.run_id, "max_restarts": o.max_restarts, "preset": o.preset, "life_span": o.life_span,
                  "schedule_timeout": o.timeout_s, "join_timeout": o.join_timeout_s, "entry_module": o.entry_module,
                  "tracker": o.tracker, "mlflow_uri": o.mlflow_uri, "mlflow_token": o.mlflow_token,
                  "args": shlex.join(o.trainer_args)}
        return [self.cli, "run", JOB, "--suffix", self.suffix(rank), *_params(params)]

    def store_command(self) -> list[str]:
        """The command that starts the store's job. It lives as long as a node's: it starts before every node, and
        the run stops itself (each node's worker.sh, a tenth of the life span early) before the first node's life
        span ends."""
        o = self.options
        params = {"port": o.port, "run_id": o.run_id, "preset": o.store_preset, "life_span": o.life_span,
                  "schedule_timeout": o.timeout_s}
        return [self.cli, "run", STORE_JOB, "--suffix", o.run_id, *_params(params)]

    def submit(self, command: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``command`` (a `run`) in the background, its output on the launcher's stderr: `<flow> run` returns
        only once its job has started (apolo run waits while the job is pending)."""
        return subprocess.Popen(command, cwd=self.repo_root, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL,
                                preexec_fn=_sigint_ignored)

    def call(self, *words: str, **options: Any) -> subprocess.CompletedProcess[str]:
        """`<flow> WORDS`, its output captured; an OSError (no CLI) or a TimeoutExpired (300 s) for the caller."""
        return subprocess.run([self.cli, *words], cwd=self.repo_root, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, timeout=300, check=False, **options)

    def status(self, job_id: str, suffix: str) -> JobStatus:
        """The job's status; "unknown" when the CLI cannot say (a network hiccup, a job not found)."""
        try:
            done = self.call("status", job_id, suffix)
        except (OSError, subprocess.TimeoutExpired):
            return JobStatus("unknown")
        return parse_status(done.stdout + done.stderr)

    def listing(self) -> Listing:
        """`<flow> ps`: every job of the flow, each node's and the store's, in one CLI process, whatever the node
        count (docs/DESIGN.md, "Scale": one call per poll, never one per job)."""
        words = f"'{self.cli} ps'"
        try:
            done = self.call("ps", env={**os.environ, "COLUMNS": PS_COLUMNS})
        except OSError as error:
            return Listing({}, f"{words} could not start: {error}")
        except subprocess.TimeoutExpired:
            return Listing({}, f"{words} did not answer within 300 s")
        if done.returncode != 0:
            last = (ANSI.sub("", done.stderr + done.stdout).strip().splitlines() or ["no output"])[-1]
            return Listing({}, f"{words} exited with {done.returncode}: {last.strip()[:160]}")
        listing = parse_listing(done.stdout)
        return Listing(listing.jobs, f"{words}: {listing.error}") if listing.error else listing

    def describe(self, job_id: str, suffix: str, listed: JobStatus) -> JobStatus:
        """``listed`` (a job the listing shows ended) with how it ended: its exit code and reason are not in `ps`'s
        table, so `<flow> status` is asked for this one job, once, for the line that names it. The listing's own
        status when `status` shows another job under the name or cannot say."""
        full = self.status(job_id, suffix)
        return full if full.job_id == listed.job_id and full.state == listed.state else listed

    def kill(self, job_id: str, suffix: str) -> bool:
        """`<flow> kill JOB SUFFIX`: returns once the platform has the job cancelled; whether that worked."""
        try:
            return self.call("kill", job_id, suffix).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def follow_logs(self, rank: int) -> subprocess.Popen[bytes]:
        """`<flow> logs` of node ``rank``'s job on the launcher's stdout, until the job ends."""
        return subprocess.Popen([self.cli, "logs", JOB, self.suffix(rank)], cwd=self.repo_root,
                                stdin=subprocess.DEVNULL, preexec_fn=_sigint_ignored)


def _params(params: dict[str, object]) -> list[str]:
    return [word for name, value in params.items() for word in ("--param", name, str(value))]
