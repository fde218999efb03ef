"""An unreachable master: one line naming address:port and what to check, within the join timeout,
instead of torch's RendezvousConnectionError traceback (``distqa.launch.reachability``, run by ``scripts/worker.sh``
on nodes 1..N-1). Loopback only."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import Any

import pytest

import distqa.launch.reachability
from distqa.launch.reachability import UNREACHABLE_EXIT_CODE, wait_for_rendezvous

from support.processes import clean_env, free_port
from support.repo import REPO_ROOT


def test_a_closed_port_is_reported_with_address_port_and_what_to_check() -> None:
    port = free_port()
    message = wait_for_rendezvous("127.0.0.1", port, timeout_s=0.5, poll_s=0.1)
    assert message is not None
    assert message.startswith(f"cannot reach the rendezvous at 127.0.0.1:{port} (node 0) within 0.5 s: "
                              "connection refused;")
    assert "check that node 0 has started" in message and "--master-port" in message


def test_a_name_that_does_not_resolve_is_reported_as_such() -> None:
    message = wait_for_rendezvous("no-such-host.invalid", 29400, timeout_s=0.2, poll_s=0.1)
    assert message is not None and "the name 'no-such-host.invalid' does not resolve" in message
    assert "DNS" in message


def test_a_node_started_before_node_0_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that starts listening only after node 1's first attempt was refused is found: node 1 may start
    first. The order is made by events (the listener waits for a refusal), not by a head start in seconds."""
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    outcomes: list[str | None] = []
    refused = threading.Event()
    real_probe = distqa.launch.reachability.probe

    def noted_probe(*args: Any, **kwargs: Any) -> str | None:
        outcome = real_probe(*args, **kwargs)
        outcomes.append(outcome)
        if outcome == "refused":
            refused.set()
        return outcome

    def listen_after_a_refusal() -> None:
        if refused.wait(timeout=60):  # a hang guard
            server.bind(("127.0.0.1", port))
            server.listen()

    monkeypatch.setattr(distqa.launch.reachability, "probe", noted_probe)
    starter = threading.Thread(target=listen_after_a_refusal)
    starter.start()
    try:
        assert wait_for_rendezvous("127.0.0.1", port, timeout_s=120, poll_s=0.1) is None
    finally:
        starter.join(timeout=70)
        server.close()
    assert outcomes[0] == "refused" and outcomes[-1] is None, outcomes


def test_worker_sh_on_node_1_without_a_master_ends_in_one_line() -> None:
    port = free_port()
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "worker.sh"), "--nnodes", "2", "--node-rank", "1", "--master-addr",
         "127.0.0.1", "--master-port", str(port), "--join-timeout", "2", "--nproc-per-node", "1", "--run-id", "lonely"],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"), capture_output=True, text=True,
        timeout=120)
    assert result.returncode == UNREACHABLE_EXIT_CODE, result.stderr
    lines = [line for line in result.stderr.splitlines() if "cannot reach" in line]
    assert lines == [f"worker.sh: run 'lonely' node 1: cannot reach the rendezvous at 127.0.0.1:{port} (node 0) "
                     "within 2 s: connection refused; the host answers but nothing listens on that port: check "
                     "that node 0 has started (scripts/worker.sh --node-rank 0) with the same --master-port, and "
                     "that it did not exit."]
    assert "Traceback" not in result.stderr and "torch.distributed.run" not in result.stderr
