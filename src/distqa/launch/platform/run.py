"""One launch on the platform: the store's or the master's job first, then the other nodes all at once, then a watch
that ends the run when a job ends, or, with a node range, submits a lost node's job again.

:class:`Watch` holds the run's state between two looks at the jobs and decides (no process, no clock: the unit
tests call it); :class:`Launch` runs the flow CLI and carries the decisions out. Ctrl-C or SIGTERM kills every job
of the run (:class:`LaunchInterruptedError`), a failure too (:class:`RunFailedError`): the caller turns them into
exit statuses.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from distqa.launch.platform.jobs import EX_PLATFORMERROR, JOB, STORE_JOB, Flow, JobStatus, Listing
from distqa.launch.platform.options import Options

UNKNOWN_LIMIT = 20
"""Looks in a row at which some job's status cannot be read before the run is given up: once is a network hiccup,
twenty times the job is gone."""


class RunFailedError(Exception):
    """A job failed, never started, or the store's job ended: every job of the run is killed, exit status 1."""


class LaunchInterruptedError(Exception):
    """Ctrl-C or SIGTERM: every job of the run is killed, exit status 130."""


def log(*words: str) -> None:
    print("[platform]", *words, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Decision:
    """What to do about one node whose job ended while the run had a node range."""

    action: Literal["resubmit", "lose", "report", "fail"]
    """resubmit its job; go on without it (lose); or, the run ending, report it (every one but the last) and fail."""
    rank: int
    line: str


@dataclass
class Watch:
    """The run's state between looks at its jobs: how often each node was submitted again, which nodes the run goes
    on without, how many looks in a row could not read a status."""

    options: Options
    flow_cli: str
    resubmits: dict[int, int] = field(default_factory=dict)
    lost: set[int] = field(default_factory=set)
    unknown_streak: int = 0

    def ended_line(self, rank: int, status: JobStatus) -> str:
        suffix = f"{self.options.run_id}-{rank}"
        return f"node {rank} ({JOB} {suffix}) {status.state}; its logs: '{self.flow_cli} logs {JOB} {suffix}'"

    def decide(self, ended: dict[int, JobStatus], succeeded: int) -> list[Decision]:
        """What to do about the nodes whose jobs failed or were cancelled in this look (every one, not just the lowest
        rank: when one node dies, the others follow within seconds, a graceful stop, and the first of them is rarely
        the cause), given how many jobs have succeeded. Without a range, or with fewer than --min-nodes left, the
        run ends (the last decision is "fail"); else node 0 hosting the store is lost, and so is a node of a run
        that has finished elsewhere or one submitted again --max-resubmits times; the others are submitted again."""
        o = self.options
        if not ended:
            return []
        if not (o.elastic and o.nodes - len(self.lost) - len(ended) >= o.min_nodes):
            lines = [self.ended_line(rank, status) for rank, status in ended.items()]
            return [Decision("report" if i < len(lines) - 1 else "fail", rank, line)
                    for i, (rank, line) in enumerate(zip(ended, lines, strict=True))]
        decisions = []
        goes_on = f"(--min-nodes {o.min_nodes})"
        for rank, status in ended.items():
            suffix = f"{o.run_id}-{rank}"
            what = f"node {rank} (job {status.job_id or '-'}, {JOB} {suffix}) {status.describe()}"
            count = self.resubmits.get(rank, 0)
            if rank == 0 and not o.external_store:
                line = (f"{self.ended_line(rank, status)}; the others go on {goes_on}; node 0 hosts the rendezvous "
                        "store: not submitted again")
            elif succeeded > 0:  # the training has ended on a node: a new job would find no run
                line = f"{what}; the run has finished on another node: not submitted again"
            elif count < o.max_resubmits:
                self.resubmits[rank] = count + 1
                decisions.append(Decision("resubmit", rank, f"{what}; resubmitting it ({count + 1} of "
                                                            f"{o.max_resubmits}); the others go on {goes_on}"))
                continue
            else:
                line = (f"{what}; submitted again {o.max_resubmits} time(s) (--max-resubmits): the others go on "
                        f"without it {goes_on}; its logs: '{self.flow_cli} logs {JOB} {suffix}'")
            self.lost.add(rank)
            decisions.append(Decision("lose", rank, line))
        return decisions

    def finished(self, succeeded: int) -> bool:
        """Every node's job has succeeded, but those the run went on without."""
        return succeeded > 0 and succeeded + len(self.lost) == self.options.nodes

    def count_unknown(self, unknown: int) -> None:
        """Note how many statuses this look could not read; :class:`RunFailedError` after UNKNOWN_LIMIT looks in a
        row."""
        self.unknown_streak = self.unknown_streak + 1 if unknown else 0
        if self.unknown_streak >= UNKNOWN_LIMIT:
            raise RunFailedError(f"the status of {unknown} job(s) could not be read {UNKNOWN_LIMIT} times in a row")


def _interrupt(signum: int, frame: object) -> None:
    raise LaunchInterruptedError


@contextmanager
def signals_ignored() -> Iterator[None]:
    """Finish a clean-up even if Ctrl-C is pressed again."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@dataclass
class Launch:
    """The jobs of one run: submitted, waited for, watched, and killed together."""

    flow: Flow
    started: list[str] = field(default_factory=list)
    """Suffixes of the nodes' jobs submitted so far (killed on failure or interrupt)."""
    store_started: bool = False
    submitting: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """`<flow> run` commands that may still wait for their job to start."""
    logs: subprocess.Popen[bytes] | None = None

    @property
    def options(self) -> Options:
        return self.flow.options

    def run(self) -> None:
        """The whole run; returns once every node has finished. Ctrl-C and SIGTERM raise
        :class:`LaunchInterruptedError`."""
        o, flow = self.options, self.flow
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, _interrupt)
        log(f"run '{o.run_id}': {o.nodes} node(s), preset {o.preset}, via {flow.cli}; results in results/{o.run_id} "
            "on storage")
        if o.external_store:  # the store first, on a CPU node of its own: every node's agent is its client
            self.store_started = True
            submitted = flow.submit(flow.store_command())
            self.submitting.append(submitted)
            master = self.wait_running("the rendezvous store's job", STORE_JOB, o.run_id, submitted, o.store_preset)
            log(f"rendezvous store {STORE_JOB} {o.run_id} is running at {master} (--external-store)")
            first_worker = 0
        else:  # the master first: the others connect to its internal hostname
            submitted = self.start_node(0, "")
            master = self.wait_running("the master job", JOB, flow.suffix(0), submitted, o.preset)
            log(f"master {JOB} {flow.suffix(0)} is running at {master}")
            first_worker = 1
        workers = {rank: self.start_node(rank, master) for rank in range(first_worker, o.nodes)}
        ended_early = 0  # nodes whose job started and ended before its `run` returned
        listing: Listing | None = None
        for rank, submitted in workers.items():
            code = submitted.wait()
            if code == 0:
                continue
            what = f"node {rank} ({JOB} {flow.suffix(rank)})"
            # One listing serves every `run` that failed: an ended job stays ended, so it is taken again only for a
            # node that it shows still pending or running (its `run` returned after it was taken).
            if listing is None or not listing.status(JOB, flow.suffix(rank)).ended:
                listing = flow.listing()
            state = listing.status(JOB, flow.suffix(rank)).state
            if state == "failed" and code == EX_PLATFORMERROR:
                self.not_scheduled(what, o.preset)
            if state not in ("failed", "cancelled", "succeeded"):
                raise RunFailedError(f"could not start {what}, status {state} (see above)")
            # it ran and has ended already: the watch reports it or submits it again
            log(f"{what} started and has already ended ({state})")
            ended_early += 1
        self.submitting = []
        if ended_early:
            log(f"all {o.nodes} nodes were started")
        elif o.nodes > 1:
            log(f"all {o.nodes} nodes are running")
        self.logs = flow.follow_logs(0)
        self.watch(master)
        self.logs.wait()
        if self.store_started:  # the nodes have ended: the store has nothing left to serve
            with signals_ignored():
                self.kill_store()
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
        log(f"run '{o.run_id}' finished on all {o.nodes} nodes; checkpoints in results/{o.run_id}/checkpoints on "
            f"storage ('{flow.cli} download results' fetches them)")

    def start_node(self, rank: int, master: str) -> subprocess.Popen[bytes]:
        """Submit node ``rank``'s job pointed at ``master``, in the background."""
        suffix = self.flow.suffix(rank)
        if suffix not in self.started:
            self.started.append(suffix)
        submitted = self.flow.submit(self.flow.node_command(rank, master))
        self.submitting.append(submitted)
        return submitted

    def not_scheduled(self, what: str, preset: str) -> None:
        raise RunFailedError(f"{what} was not started within {self.options.timeout_s} s; is preset '{preset}' "
                             "available ('apolo config show')? Raise --timeout to wait longer for a node.")

    def wait_running(self, what: str, job_id: str, suffix: str, submitted: subprocess.Popen[bytes],
                     preset: str) -> str:
        """The job's internal hostname, once it runs and has one. The platform fails a job still pending after its
        schedule_timeout (= --timeout); the launcher's own deadline, a minute later, covers a CLI that hangs. Its
        `run` is never waited for while it runs: how a failed job failed, that `run` says once it has returned (a
        job can start and fail before then: a node lost, not a preset unavailable). One job: `<flow> status` per
        look, which gives its hostname too (`ps` has none)."""
        o, flow = self.options, self.flow
        deadline = time.monotonic() + o.timeout_s + 60
        code: int | None = None
        while True:
            if code is None:
                code = submitted.poll()
            status = flow.status(job_id, suffix)
            if status.state == "running" and status.host:
                break
            if status.state in ("succeeded", "cancelled"):
                raise RunFailedError(f"{what} ended ({status.state}) before the other jobs started; see "
                                f"'{flow.cli} logs {job_id} {suffix}'")
            if status.state == "failed":
                if code is not None and code != EX_PLATFORMERROR:
                    raise RunFailedError(f"{what} failed before the other jobs started; see '{flow.cli} logs {job_id} "
                                    f"{suffix}'")
                if code is not None or time.monotonic() >= deadline:
                    self.not_scheduled(f"{what} ({job_id} {suffix})", preset)
            if code:
                raise RunFailedError(f"could not start {what}: '{flow.cli} run {job_id} --suffix {suffix} ...' failed "
                                "(see above)")
            if time.monotonic() >= deadline:
                self.not_scheduled(f"{what} (last status: {status.state})", preset)
            time.sleep(o.poll_s)
        if code is None:
            submitted.wait()
        self.submitting = []
        return status.host

    def watch(self, master: str) -> None:
        """Look at every job each --poll seconds until every node has finished: one `<flow> ps` a look, whatever the
        node count, and `<flow> status` only for a job that has ended, to say how. The store's job ending ends the
        run at once: every node's rendezvous is gone with it. The job that ended is still the node's until the
        platform has its new one: not an end again."""
        o, flow = self.options, self.flow
        watch = Watch(o, flow.cli)
        replaced: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}  # rank: the ended job's id, the new `run`
        unread = ""  # why the last listing could not be read: said once, not at every look
        while True:
            time.sleep(o.poll_s)
            listing = flow.listing()
            if listing.error and listing.error != unread:
                log(f"could not read the jobs' statuses: {listing.error}; every job's status is unknown this time "
                    f"(the run is given up after {UNKNOWN_LIMIT} such looks in a row)")
            unread = listing.error
            unknown = succeeded = 0
            if o.external_store:  # first: the nodes' own failures follow from its loss
                store = listing.status(STORE_JOB, o.run_id)
                if store.ended:
                    store = flow.describe(STORE_JOB, o.run_id, store)  # its exit code, for the run's last line
                    raise RunFailedError(
                        f"the rendezvous store's job ({STORE_JOB} {o.run_id}, job {store.job_id or '-'}) ended: "
                        f"{store.describe()}; every node's rendezvous is gone with it; its logs: '{flow.cli} logs "
                        f"{STORE_JOB} {o.run_id}'. Run again with --run-id {o.run_id} to resume from the newest "
                        "checkpoint")
                unknown += store.state == "unknown"
            ended: dict[int, JobStatus] = {}
            for rank in range(o.nodes):
                if rank in watch.lost:
                    continue
                status = listing.status(JOB, flow.suffix(rank))
                old = replaced.get(rank)
                if old and status.job_id == old[0] and old[1].poll() is None:
                    continue
                if status.state == "succeeded":
                    succeeded += 1
                elif status.state in ("failed", "cancelled"):
                    # With a node range the lines say how it ended (`status`, this job alone); without one, the
                    # state is all the run's last line needs.
                    ended[rank] = flow.describe(JOB, flow.suffix(rank), status) if o.elastic else status
                unknown += status.state == "unknown"
            for decision in watch.decide(ended, succeeded):
                if decision.action == "fail":
                    raise RunFailedError(decision.line)
                log(decision.line)
                if decision.action == "resubmit":
                    replaced[decision.rank] = (ended[decision.rank].job_id, self.start_node(decision.rank, master))
            if watch.finished(succeeded):
                return
            watch.count_unknown(unknown)

    def kill_store(self) -> bool:
        """Kill the store's job; whether that worked."""
        o = self.options
        log(f"killing {STORE_JOB} {o.run_id} (the rendezvous store)")
        if not self.flow.kill(STORE_JOB, o.run_id):
            log(f"could not kill {STORE_JOB} {o.run_id}: run '{self.flow.cli} kill {STORE_JOB} {o.run_id}'")
            return False
        return True

    def kill_all(self) -> bool:
        """Stop the CLI commands still running, kill every node's job, then the store's (last: the nodes' agents
        leave the rendezvous while they stop); Ctrl-C is ignored meanwhile. Whether every kill worked."""
        killed = True
        with signals_ignored():
            for process in [self.logs, *self.submitting]:
                if process is not None and process.poll() is None:
                    process.terminate()
            for suffix in self.started:
                log(f"killing {JOB} {suffix}")
                if not self.flow.kill(JOB, suffix):
                    log(f"could not kill {JOB} {suffix}: run '{self.flow.cli} kill {JOB} {suffix}'")
                    killed = False
            if self.store_started:
                killed = self.kill_store() and killed
        return killed
