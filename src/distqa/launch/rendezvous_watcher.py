"""What the agent knows of who joined its rendezvous, for its one-line diagnoses (:mod:`distqa.launch.agent`).

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import threading
from dataclasses import dataclass
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

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
