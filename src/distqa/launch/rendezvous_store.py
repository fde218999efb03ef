"""The rendezvous store outside the training nodes, so that no training node's loss ends the run (issue 34).

By default node 0's torchrun agent hosts the c10d rendezvous store (``--rdzv-conf is_host=1``): losing node 0
takes the store, and with it every other node. Run this on a machine that trains nothing (a small CPU job on the
platform, the Slurm batch host, the launcher's machine) and start every node with ``scripts/worker.sh
--external-store --master-addr THIS_HOST --master-port PORT``: every agent is then the store's client
(``is_host=0`` on node 0 too) and an elastic run (``--min-nodes``) goes on whichever node is lost::

    python -m distqa.launch.rendezvous_store --port 29400

It prints one line once the store listens, serves until SIGTERM or SIGINT, and then exits 0. The store is the one
torch's c10d backend opens itself (``c10d_rendezvous_backend._create_tcp_store``): a ``TCPStore`` master,
``multi_tenant`` as torch opens it; ``wait_for_workers=False``, since its clients come and go with the nodes.
Its state is in memory: losing this process ends the run as losing node 0 did (start it again and every node with
the same ``--run-id``: the run resumes from its newest checkpoint).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta

DEFAULT_PORT = 29400  # torch's c10d_rendezvous_backend.DEFAULT_PORT, worker.sh's --master-port default


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.launch.rendezvous_store",
                                     description="Host the c10d rendezvous store of a multi-node run outside its "
                                                 "training nodes (scripts/worker.sh --external-store).")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"TCP port to listen on (default {DEFAULT_PORT}); the nodes' --master-port")
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to listen on (default 0.0.0.0: every interface); 127.0.0.1 for local runs")
    return parser


def serve(host: str, port: int, stop: threading.Event) -> None:
    """Hold a store on host:port until ``stop`` is set."""
    from torch.distributed import TCPStore  # imported here: --help and a wrong port answer without torch

    store = TCPStore(host, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                     timeout=timedelta(seconds=60))
    print(f"distqa.launch.rendezvous_store: serving the rendezvous store on {host}:{port}; start every node with "
          f"scripts/worker.sh --external-store --master-addr <this host> --master-port {port}", flush=True)
    try:
        stop.wait()
    finally:
        del store


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if not 1024 <= args.port <= 65535:
        print(f"distqa.launch.rendezvous_store: --port must be in 1024..65535, got {args.port}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, frame: stop.set())
    try:
        serve(args.host, args.port, stop)
    except (RuntimeError, OSError) as err:  # the port is taken, the address is not this machine's
        print(f"distqa.launch.rendezvous_store: cannot serve on {args.host}:{args.port}: {err}".splitlines()[0] +
              "; pick another --port (and pass it to every node as --master-port)", file=sys.stderr)
        return 1
    print(f"distqa.launch.rendezvous_store: stopped on signal; the store on {args.host}:{args.port} is closed",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
