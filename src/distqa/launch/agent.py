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

Who joined is read by :class:`~distqa.launch.rendezvous_watcher.RendezvousWatcher` while the agent waits in a
rendezvous.

A graceful stop (:mod:`distqa.distributed.stop`, exit 75) ends the agent too, whatever ``--max-restarts`` says: see
:func:`membership_rounds`; but not the stop torchrun itself asks for when it restarts the workers into a new
rendezvous round (a node joined: ``--nnodes MIN:MAX``). Each round's number
goes to the workers as ``WORKER_RENDEZVOUS_ROUND`` (:mod:`distqa.distributed.elastic`'s membership line).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.run import main as torchrun_main
from torch.distributed.run import parse_args, parse_min_max_nnodes

# The report folder's name from distqa.config.errors, which imports nothing: distqa.distributed.stop would bring
# distqa.distributed.runtime and the settings into an agent that uses neither (every node's agent pays its imports
# before the workers start).
from distqa.config.errors import PEER_LOST_REPORT, WORKER_REPORT_DIR_VARIABLE
from distqa.launch.rendezvous_watcher import RendezvousWatcher

ROUND_VARIABLE = "WORKER_RENDEZVOUS_ROUND"
"""distqa.distributed.elastic.ROUND_VARIABLE (not imported: distqa.distributed.elastic brings in the settings)."""

RENDEZVOUS_TIMEOUT_EXIT_CODE = 4
"""Exit code of an agent whose rendezvous did not fill up within the join timeout."""
STORE_LOST_EXIT_CODE = 1
"""The rendezvous store went during the run: the status torchrun itself ends with then, said in one line."""

log = logging.getLogger(__name__)


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
        code = _refusal_code(report_dir)
        reported = all(os.path.isfile(f"{report_dir}/exit-{code}-rank-{rank}") for rank in err.failures)
        if code is None or {failure.exitcode for failure in err.failures.values()} != {code} or not reported:
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
