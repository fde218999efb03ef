"""Can this node reach the rendezvous? One line that says why not, instead of torch's traceback.

The node (:mod:`distqa.launch.node`) waits with :func:`wait_for_rendezvous` on nodes 1..N-1 (every node, with an
external store) before starting torchrun; the local and Slurm launchers wait for the store they start by hand::

    python -m distqa.launch.reachability HOST PORT TIMEOUT_S

It retries a TCP connection to the rendezvous store until it succeeds or ``TIMEOUT_S`` has passed, so a node started
before node 0 simply waits. On failure it prints one line naming ``HOST:PORT``, what the last attempt found (name not
resolvable, connection refused, no answer) and what to check, and exits 3; torchrun's agent would give up after its
store timeout (60 s) with a ``RendezvousConnectionError`` traceback. Standard library only: it runs before anything
heavy is imported.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from collections.abc import Sequence

UNREACHABLE_EXIT_CODE = 3

_ADVICE = {
    "unresolvable": "check the name (--master-addr: node 0's internal hostname on the platform, the first "
                    "host of the allocation under Slurm) and this node's DNS; a platform job's name resolves "
                    "only once that job is running",
    "refused": "the host answers but nothing listens on that port: check that node 0 has started "
               "(scripts/worker.sh --node-rank 0) with the same --master-port, and that it did not exit",
    "silent": "no answer at all: check that the address is node 0's on a network this node shares (not "
              "127.0.0.1 or a public address), and that no firewall blocks the port between the nodes",
}


def probe(host: str, port: int, attempt_s: float = 2.0) -> str | None:
    """One attempt: None when a TCP connection opens, else 'unresolvable', 'refused' or 'silent'."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return "unresolvable"
    outcome = "silent"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(attempt_s)
            try:
                sock.connect(address)
                return None
            except ConnectionRefusedError:
                outcome = "refused"
            except OSError as err:  # timeouts, unreachable networks
                if err.errno == errno.ECONNREFUSED:
                    outcome = "refused"
    return outcome


def wait_for_rendezvous(host: str, port: int, timeout_s: float, poll_s: float = 1.0) -> str | None:
    """Retry :func:`probe` until it connects (None) or ``timeout_s`` has passed: then the message."""
    started = time.monotonic()
    while True:
        outcome = probe(host, port, attempt_s=min(2.0, max(timeout_s, 0.1)))
        if outcome is None:
            return None
        waited = time.monotonic() - started
        if waited >= timeout_s:
            found = {"unresolvable": f"the name {host!r} does not resolve", "refused": "connection refused",
                     "silent": "no answer"}[outcome]
            return (f"cannot reach the rendezvous at {host}:{port} (node 0) within {timeout_s:g} s: {found}; "
                    f"{_ADVICE[outcome]}.")
        time.sleep(min(poll_s, max(timeout_s - waited, 0)))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python -m distqa.launch.reachability HOST PORT TIMEOUT_S", file=sys.stderr)
        return 2
    host, port, timeout_s = args[0], int(args[1]), float(args[2])
    message = wait_for_rendezvous(host, port, timeout_s)
    if message is None:
        return 0
    print(message, file=sys.stderr)
    return UNREACHABLE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
