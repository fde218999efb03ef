"""torchrun's agent, run in this process, with a rendezvous that times out said in one line.

Every node runs it in place of ``python -m torch.distributed.run``: ``scripts/worker.sh`` execs
:mod:`distqa.launch.node`, which calls :func:`main` in the same process. By hand::

    python -m distqa.launch.agent NODE_RANK [TORCHRUN ARGS...]

``NODE_RANK`` is worker.sh's ``--node-rank``; the rest goes to torchrun unchanged (``torch.distributed.run
.main``, so its own error reports, exit codes and signal handling stay as they are). Two things change:
a rendezvous store lost during the run (node 0 gone, without ``--external-store``) ends the agent with one line
instead of torchrun's ``RendezvousConnectionError`` traceback; and when a node never joins, torchrun's agents
end after the join timeout with a bare ``RendezvousTimeoutError`` traceback that names neither the address nor
the missing node. Here the agent ends with one line naming the rendezvous ``HOST:PORT``, the nodes expected and
those that joined (by their ``--node-rank`` and address), what to check, and exit code
:data:`RENDEZVOUS_TIMEOUT_EXIT_CODE`.

Who joined is read while the agent waits in a rendezvous: a thread connects to the rendezvous store as a client,
appends this node's rank, address and agent pid to one key all nodes share, and every couple of seconds reads the
rendezvous state through torch's own backend (``C10dRendezvousBackend.get_state``: the pickled
``_RendezvousState`` of ``dynamic_rendezvous``, whose participants are ``(addr, pid, local_id)``), and the shared key
only when the state names a node it has not placed yet. What is reported is every node seen in the newest round whose
state had this node in it: at its deadline each agent removes its own node from the state before raising, so a state
read then lacks nodes that did join. While the workers run, the watcher reads nothing (one more read as a round
completes): at 256 nodes a watcher that kept reading would add a store request per node every couple of seconds for
the whole run, and the store is one process that every agent's own rendezvous traffic goes to
(docs/SCALING.md).

A graceful stop (:mod:`distqa.distributed.stop`, exit 75) ends the agent too, whatever ``--max-restarts`` says: see
:func:`membership_rounds`; but not the stop torchrun itself asks for when it restarts the workers into a new
rendezvous round (a node joined: ``--nnodes MIN:MAX``). Each round's number
goes to the workers as ``WORKER_RENDEZVOUS_ROUND`` (:mod:`distqa.launch.elastic`'s membership line).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

from torch.distributed import TCPStore
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.run import main as torchrun_main
from torch.distributed.run import parse_args, parse_min_max_nnodes

# The report folder's name from distqa.errors, which imports nothing: distqa.distributed.stop would bring
# distqa.distributed.runtime and
# the settings into an agent that uses neither (every node's agent pays its imports before the workers start).
from distqa.errors import PEER_LOST_REPORT, WORKER_REPORT_DIR_VARIABLE

ROUND_VARIABLE = "WORKER_RENDEZVOUS_ROUND"
"""distqa.launch.elastic.ROUND_VARIABLE (not imported: distqa.launch.elastic brings in the settings)."""

RENDEZVOUS_TIMEOUT_EXIT_CODE = 4
"""Exit code of an agent whose rendezvous did not fill up within the join timeout."""
STORE_LOST_EXIT_CODE = 1
"""The rendezvous store went during the run: the status torchrun itself ends with then, said in one line."""

POLL_S = 2.0
"""How often the watcher reads the rendezvous state, and the timeout of each of its store calls."""
JOIN_GUARD_S = 5 * POLL_S
"""A hang guard on the watcher's end: a store that accepts a connection and never answers holds a ``TCPStore``
call past its timeout (torch 2.13's client ping has no deadline)."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinedNode:
    """A node seen in the rendezvous: its worker.sh --node-rank when it announced one, else None."""

    node_rank: int | None
    addr: str


class RendezvousWatcher:
    """Reads, while the agent waits, which nodes have joined its c10d rendezvous (see the module doc)."""

    def __init__(self, host: str, port: int, run_id: str, node_rank: int, nnodes: int, addr: str,
                 hosts_store: bool = False, min_nodes: int | None = None) -> None:
        self.min_nodes = nnodes if min_nodes is None else min_nodes
        """torchrun's --nnodes MIN:MAX: the round completes with MIN; ``nnodes`` is MAX (worker.sh's --nnodes)."""
        self.host, self.port, self.run_id = host, port, run_id
        self.node_rank, self.nnodes, self.addr = node_rank, nnodes, addr
        self.hosts_store = hosts_store
        """This node's agent serves the rendezvous store (torchrun's ``is_host``): the watcher is its client in the
        same process."""
        self.joined: list[JoinedNode] | None = None
        """The nodes of the newest round seen with this node in it; None until one is seen."""
        self._seen: tuple[int, set[tuple[str, int]]] | None = None
        """That round's number and every (addr, pid) seen in it."""
        self._server: TCPStore | None = None
        """On the node that hosts the store: a second handle on its server (see :meth:`_hold_the_server`)."""
        self._backend: tuple[TCPStore, C10dRendezvousBackend] | None = None
        """torch's reader of the rendezvous state, on the store it reads (made once per connection)."""
        self._announced: dict[tuple[str, int], int] = {}
        """Every (addr, agent pid) read from the announcements so far, with its node rank."""
        self._in_rendezvous = threading.Event()
        """Set while torchrun's agent is in a rendezvous (:meth:`rendezvous_begins`): the watcher reads only then."""
        self._read_once_more = threading.Event()
        """Set as a rendezvous ends: one more read sees the round it completed."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="distqa-rendezvous-watcher", daemon=True)

    @property
    def _key(self) -> str:
        return f"distqa.launch.agent.{self.run_id}.nodes"

    def rendezvous_begins(self) -> None:
        self._in_rendezvous.set()

    def rendezvous_ends(self) -> None:
        self._in_rendezvous.clear()
        self._read_once_more.set()

    def start(self) -> RendezvousWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, and return once the thread has ended. The join matters: a daemon thread still
        inside a store call when the interpreter shuts down aborts the whole agent (exit 134, "terminate
        called without an active exception") as the call returns, since it may no longer take the GIL.
        A call times out after ``POLL_S`` (one to a store that has closed fails sooner), so this waits about that
        long at most; :data:`JOIN_GUARD_S` bounds a call that ignores its timeout."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=JOIN_GUARD_S)
        if not self._thread.is_alive():
            self._server = None  # the watcher's connection is closed: the server may go when torch's handle goes

    def _watch(self) -> None:
        store = None
        try:
            while not self._stopped.wait(POLL_S):
                if not self._in_rendezvous.is_set() and not self._read_once_more.is_set():
                    continue  # the workers run: nothing to diagnose, and no store request
                self._read_once_more.clear()
                try:
                    if store is None:  # node 0's store exists once its agent has started: retry until then
                        store = TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=POLL_S),
                                         wait_for_workers=False)
                        self._hold_the_server()
                        announcement = {"addr": self.addr, "pid": os.getpid(), "rank": self.node_rank}
                        store.append(self._key, json.dumps(announcement) + "\n")
                    self._read(store)
                except Exception as err:  # a diagnosis aid must never end the agent
                    log.debug("rendezvous watcher: %s", err)
                    store = None
        finally:
            del store  # the connection closes here, before the server that _hold_the_server keeps

    def _hold_the_server(self) -> None:
        """On the node that hosts the store, keep its server up until the watcher has stopped. torchrun's agent
        closes it as it returns (its rendezvous handler, which owns it, goes), a moment before :meth:`stop`; a
        watcher's call to it then fails, and TCPStore's client logs that in C++ with a stack trace ("recvVector
        failed … Connection was likely closed") after a run that ended well. torch's c10d backend opens the store
        ``multi_tenant``, so a second multi-tenant master on the same port in this process shares that server
        (``TCPServer::start``'s cache) instead of binding one; the server ends once both handles have gone.
        Tried once, when the watcher first reaches the server: a port taken by something else fails to bind here,
        and the watcher then reads as a client only."""
        if not self.hosts_store or self._server is not None:
            return
        self.hosts_store = False
        with contextlib.suppress(Exception):
            self._server = TCPStore(self.host, self.port, is_master=True, multi_tenant=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=POLL_S))

    def _read(self, store: TCPStore) -> None:
        if self._backend is None or self._backend[0] is not store:  # its constructor is a store request of its own
            self._backend = (store, C10dRendezvousBackend(store, self.run_id))
        found = self._backend[1].get_state()
        if found is None:
            return
        state = pickle.loads(found[0])  # torch's own pickled _RendezvousState, from torch's own store
        nodes = {(node.addr, node.pid) for node in (*state.participants, *state.wait_list)}
        if (self.addr, os.getpid()) not in nodes:
            return
        # Within a round, a node that joined counts as joined: at its own deadline (a moment before this node's)
        # another node's agent removes itself from the state before it raises, and a read in between would
        # otherwise report it as never joined.
        if self._seen is not None and self._seen[0] == state.round:
            nodes |= self._seen[1]
        self._seen = (state.round, nodes)
        if not nodes <= self._announced.keys():  # one request for every node's announcement, only for a new node
            for line in store.get(self._key).decode().splitlines():
                entry = json.loads(line)
                self._announced[(entry["addr"], entry["pid"])] = entry["rank"]
        announced = self._announced
        self.joined = sorted((JoinedNode(announced.get(node), node[0]) for node in nodes),
                             key=lambda node: (node.node_rank is None, node.node_rank or 0, node.addr))

    @property
    def incomplete(self) -> bool:
        """A state with this node but fewer than the expected nodes was the last one seen."""
        return self.joined is not None and len(self.joined) < self.nnodes

    def store_lost_message(self) -> str:
        """The one line for a store lost after the rendezvous filled up (node 0 lost, or the external store)."""
        return (f"lost the rendezvous store at {self.host}:{self.port} during the run (node 0 serves it, unless "
                f"--external-store runs it apart), so no new round can form: start the nodes again with --run-id "
                f"{self.run_id} to resume from the newest checkpoint; for a run that outlives node 0, use "
                "--external-store with --min-nodes (docs/FAULT_TOLERANCE.md)")

    def timeout_message(self, join_timeout_s: str, store_closed: bool = False) -> str:
        """The one line for a rendezvous that did not fill up in time. ``store_closed``: this node lost the
        store (node 0 ended at its own deadline, which falls a moment before this node's) instead."""
        where = f"the rendezvous '{self.run_id}' at {self.host}:{self.port}"
        if store_closed:
            where += " (hosted by node 0, which ended meanwhile)"
        at_least = f", at least {self.min_nodes} to start" if self.min_nodes < self.nnodes else ""
        expected = f"{self.nnodes} nodes (--node-rank 0..{self.nnodes - 1}{at_least})"
        check = (f"check that every node was started (scripts/worker.sh --node-rank I) with --nnodes {self.nnodes} "
                 f"--run-id {self.run_id} --master-addr {self.host} --master-port {self.port}, that its job is "
                 "running and not still queued (raise --join-timeout), and its log for an error before it joined")
        if self.joined is None:
            return f"{where} timed out after {join_timeout_s} s waiting for {expected}; {check}."
        joined = ", ".join(f"node {node.node_rank} at {node.addr}" if node.node_rank is not None
                           else f"a node at {node.addr} (not started by worker.sh)" for node in self.joined)
        present = {node.node_rank for node in self.joined}
        missing = [str(rank) for rank in range(self.nnodes) if rank not in present]
        never = f"; node {', '.join(missing)} never joined" if missing else ""
        return (f"{where} timed out after {join_timeout_s} s with {len(self.joined)} of {expected} joined "
                f"({joined}){never}: {check}.")


class SignalsSeen:
    """Whether this process has received a signal since :meth:`install`: the interpreter writes each one's
    number to a pipe (``signal.set_wakeup_fd``), whoever handles it. It sees the signals that have a Python
    handler, which torchrun installs for SIGTERM, SIGINT, SIGHUP and SIGQUIT when it starts the workers."""

    def __init__(self) -> None:
        self._read_end: int | None = None
        self._seen = False

    def install(self) -> SignalsSeen:
        """From the main thread (Python's rule for ``set_wakeup_fd``)."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._read_end = read_end
        return self

    def any(self) -> bool:
        if not self._seen and self._read_end is not None:
            with contextlib.suppress(BlockingIOError):
                self._seen = bool(os.read(self._read_end, 512))
        return self._seen


def _reported_exit_code(err: ChildFailedError, report_dir: str | None) -> int | None:
    """The exit code every failed worker reported (distqa.errors.report_failure: ``exit-<CODE>-rank-<R>`` in the
    report folder), or None when one did not."""
    codes = {failure.exitcode for failure in err.failures.values()}
    if not report_dir or len(codes) != 1 or not all(
            (Path(report_dir) / f"exit-{failure.exitcode}-rank-{rank}").is_file()
            for rank, failure in err.failures.items()):
        return None
    return codes.pop()


def _refusal_code(report_dir: str | None) -> int | None:
    """The exit code this node's workers reported refusing with (``exit-<CODE>-rank-<R>``, one code for all), or None
    when none reported one."""
    codes = {name.split("-")[1] for name in os.listdir(report_dir) if name.startswith("exit-")} if report_dir else set()
    return int(codes.pop()) if len(codes) == 1 else None


@contextlib.contextmanager
def watching_until_the_exit_barrier(watcher: RendezvousWatcher | None) -> Iterator[None]:
    """Have ``watcher`` read while torchrun's agent is in a rendezvous (``SimpleElasticAgent._rendezvous``, each
    round's), and stop it as this node's workers have all finished, before torchrun's agent waits for the others
    (``SimpleElasticAgent._exit_barrier``): nothing is left to diagnose then, and node 0's agent closes the store
    as soon as the barrier lets it go, so a read of another node's watcher after that made TCPStore's client log
    "recvVector failed" with a C++ stack trace after a run that ended well."""
    if watcher is None:
        yield
        return
    exit_barrier, rendezvous = SimpleElasticAgent._exit_barrier, SimpleElasticAgent._rendezvous

    def exit_barrier_without_the_watcher(agent: SimpleElasticAgent) -> None:
        watcher.stop()
        exit_barrier(agent)

    def rendezvous_watched(agent: SimpleElasticAgent, worker_group: Any) -> None:
        watcher.rendezvous_begins()
        try:
            rendezvous(agent, worker_group)
        finally:
            watcher.rendezvous_ends()

    with mock.patch.object(SimpleElasticAgent, "_exit_barrier", exit_barrier_without_the_watcher), \
            mock.patch.object(SimpleElasticAgent, "_rendezvous", rendezvous_watched):
        yield


@contextlib.contextmanager
def membership_rounds(report_dir: str | None, signals: SignalsSeen | None) -> Iterator[None]:
    """torchrun's restarts of the worker group, told apart (``SimpleElasticAgent._restart_workers``).

    Workers that stopped on a signal (:mod:`distqa.distributed.stop`: a checkpoint of the step reached, exit 75, a
    report in ``report_dir``) look failed to torchrun, which with ``--max-restarts`` left would start them again into a
    rendezvous that the stopped nodes never join. So such a restart ends this agent with a SIGTERM, as the platform or
    Slurm would (not when the agent got a signal itself: it is stopping its workers already, and a second signal would
    make it signal them again, ending a worker still on its way out at once) — unless a node is waiting to join
    (``--nnodes MIN:MAX``): then another node's agent stopped its workers for the round that node joins, and these
    stopped by the ranks' agreement. That, and torchrun's own restart when it sees a node waiting, is the end of a
    round: the reports are removed, the restart is given back (a membership change spends none, as in torchrun) and the
    workers of the next round start. After each rendezvous the round's number (torch's ``_RendezvousState.round``, the
    same on every node) goes into the environment that torchrun gives the workers it starts next."""
    restart_workers, stop_workers = SimpleElasticAgent._restart_workers, LocalElasticAgent._stop_workers
    rendezvous = SimpleElasticAgent._rendezvous
    in_a_new_round = threading.Event()

    def clear_reports() -> bool:
        """Remove the workers' stop reports; whether there were any."""
        found = list(Path(report_dir).glob("rank-*")) if report_dir else []
        for report in found:
            report.unlink(missing_ok=True)
        return bool(found)

    def restart_workers_for_a_new_round(agent: SimpleElasticAgent, worker_group: Any) -> None:
        lost_peer = list(Path(report_dir).glob(PEER_LOST_REPORT.format(rank="*"))) if report_dir else []
        # Its workers saved the last step and left for the round without the lost one (distqa.training.peer_loss).
        if lost_peer:
            for report in lost_peer:
                report.unlink(missing_ok=True)
            agent._remaining_restarts += 1  # a membership change spends no restart
        if report_dir and any(Path(report_dir).glob("rank-*")):
            if worker_group.spec.rdzv_handler.num_nodes_waiting() > 0:
                clear_reports()
                agent._remaining_restarts += 1  # torchrun took one for the workers' exit 75 (its FAILED state)
            elif signals is None or not signals.any():
                os.kill(os.getpid(), signal.SIGTERM)  # torchrun's handler raises here: the agent stops
        in_a_new_round.set()
        try:
            restart_workers(agent, worker_group)
        finally:
            in_a_new_round.clear()

    def stop_workers_of_this_round(agent: LocalElasticAgent, worker_group: Any) -> None:
        stop_workers(agent, worker_group)
        if in_a_new_round.is_set():  # workers stopped by torchrun for the next round: their exit 75 ends no node
            clear_reports()

    def rendezvous_with_its_round(agent: SimpleElasticAgent, worker_group: Any) -> None:
        rendezvous(agent, worker_group)
        state = getattr(getattr(worker_group.spec.rdzv_handler, "_state_holder", None), "state", None)
        os.environ[ROUND_VARIABLE] = str(getattr(state, "round", "?"))

    with mock.patch.object(SimpleElasticAgent, "_restart_workers", restart_workers_for_a_new_round), \
            mock.patch.object(LocalElasticAgent, "_stop_workers", stop_workers_of_this_round), \
            mock.patch.object(SimpleElasticAgent, "_rendezvous", rendezvous_with_its_round):
        yield


def rendezvous_conf(text: str) -> dict[str, str]:
    """torchrun's ``--rdzv-conf`` as its keys and values (``is_host=1,join_timeout=900``)."""
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].isdigit():
        print("usage: python -m distqa.launch.agent NODE_RANK [TORCHRUN ARGS...]", file=sys.stderr)
        return 2
    node_rank, torchrun_args = int(args[0]), args[1:]
    options = parse_args(torchrun_args)
    watcher = None
    if not options.standalone and options.rdzv_backend == "c10d":
        host, port = parse_rendezvous_endpoint(options.rdzv_endpoint, default_port=29400)
        min_nodes, nnodes = parse_min_max_nnodes(options.nnodes)
        addr = options.local_addr or socket.getfqdn()  # what torch's _NodeDescGenerator records
        # torch's reading of a boolean setting (RendezvousParameters.get_as_bool)
        hosts_store = rendezvous_conf(options.rdzv_conf).get("is_host", "").lower() in ("1", "true", "t", "yes", "y")
        watcher = RendezvousWatcher(host, port, options.rdzv_id, node_rank, nnodes, addr, hosts_store,
                                    min_nodes).start()
    report_dir = os.environ.get(WORKER_REPORT_DIR_VARIABLE)
    signals = SignalsSeen().install() if report_dir else None
    try:
        with watching_until_the_exit_barrier(watcher), membership_rounds(report_dir, signals):
            torchrun_main(torchrun_args)
    except ChildFailedError as err:
        if (code := _reported_exit_code(err, report_dir)) is None:
            raise
        return code  # each failed worker said why in one line: no traceback of torchrun's below it
    except (RendezvousTimeoutError, RendezvousConnectionError, RendezvousClosedError) as err:
        # Workers that refused on every node end their agents apart: the node whose workers exit first takes the
        # store with it (node 0) or closes the rendezvous, and an agent still watching its own refusing workers
        # finds that in its next check (SimpleElasticAgent._invoke_run: num_nodes_waiting). They said why already.
        if (code := _refusal_code(report_dir)) is not None:
            return code
        # Node 0 ends at its own deadline, a moment before this node's, and on its way out torchrun closes the
        # rendezvous (DynamicRendezvousHandler.shutdown): this node then finds it closed, or the store gone.
        store_closed = isinstance(err, RendezvousConnectionError | RendezvousClosedError)
        if watcher is not None and store_closed and watcher.joined is not None and not watcher.incomplete:
            # The rendezvous had filled, and its store went during the run: node 0 (its host, without
            # --external-store) or the store's own job is gone. No new round can form without it.
            print(f"distqa.launch.agent: node {node_rank}: {watcher.store_lost_message()}", file=sys.stderr)
            return STORE_LOST_EXIT_CODE
        # A lost store is only a timeout's diagnosis while the rendezvous was still filling up; otherwise (a
        # network fault before any state was seen) torchrun's own report stays.
        if watcher is None or (store_closed and (node_rank == 0 or not watcher.incomplete)):
            raise
        message = watcher.timeout_message(rendezvous_conf(options.rdzv_conf).get("join_timeout", "600"), store_closed)
        print(f"distqa.launch.agent: node {node_rank}: {message}", file=sys.stderr)
        return RENDEZVOUS_TIMEOUT_EXIT_CODE
    finally:
        if watcher is not None:
            watcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
