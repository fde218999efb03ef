"""The external rendezvous store (issue 34 part 4, ``python -m distqa.launch.rendezvous_store``): it serves a client
and exits 0 on SIGTERM, a port already taken is one line; the local launcher's ``--external-store`` starts it first
and stops it, and ``worker.sh --external-store`` makes node 0 its client (node 0 lost in a run:
tests/distributed/test_rendezvous_store.py)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from distqa.launch.reachability import probe

from support.processes import clean_env, free_port, node_in_process
from support.rendezvous import start_store, wait_for_line
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import finish


def test_the_store_serves_a_client_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    store = start_store(port, tmp_path / "store.out")
    try:
        wait_for_line(tmp_path / "store.out", f"serving the rendezvous store on 127.0.0.1:{port}", store)
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("run/key", "value")
        assert TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30)).get("run/key") == b"value"
        del client
        store.send_signal(signal.SIGTERM)
        finish(store, timeout=60)
    finally:
        if store.poll() is None:
            os.killpg(store.pid, signal.SIGKILL)
    assert store.returncode == 0, (tmp_path / "store.out").read_text()
    assert "stopped on signal" in (tmp_path / "store.out").read_text()


def test_a_port_already_taken_is_one_line_and_exit_1(tmp_path: Path) -> None:
    port = free_port()
    first = start_store(port, tmp_path / "first.out")
    try:
        wait_for_line(tmp_path / "first.out", "serving the rendezvous store", first)
        second = subprocess.run([sys.executable, "-m", "distqa.launch.rendezvous_store", "--host", "127.0.0.1",
                                 "--port",
                                 str(port)], cwd=REPO_ROOT, env=clean_env(), capture_output=True, text=True,
                                timeout=60)
    finally:
        first.send_signal(signal.SIGTERM)
        finish(first, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(f"distqa.launch.rendezvous_store: cannot serve on 127.0.0.1:{port}: ") \
        and "another --port" in line


def test_the_local_launcher_starts_the_store_first_and_stops_it_at_the_end(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "run_distributed_locally.sh"), "--nodes", "2", "--port", str(port),
         "--run-id", "external", "--external-store", "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
         "--max-steps", "1"],
        cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, OMP_NUM_THREADS="1", RDZV_JOIN_TIMEOUT="60"),
        capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"serving the rendezvous store on 127.0.0.1:{port}" in output
    assert output.count(f"rendezvous 127.0.0.1:{port} (an external store)") == 2, output
    assert "stopped on signal" in output  # the launcher's trap ended it; nothing listens on the port any more
    assert probe("127.0.0.1", port) == "refused"


def test_worker_sh_external_store_makes_node_0_a_client_and_needs_the_stores_address(tmp_path: Path) -> None:
    def worker(*extra: str) -> subprocess.CompletedProcess[str]:  # the node in this process (no bash, no start)
        return node_in_process(["--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--external-store",
                                "--dry-run", *extra, "--", *MACHINERY_ARGS, "--output-dir", str(tmp_path)],
                               clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1"))

    refused = worker()
    assert refused.returncode == 2 and "--external-store needs --master-addr" in refused.stderr, refused.stderr
    dry = worker("--master-addr", "store-host", "--master-port", "29555")
    assert dry.returncode == 0, dry.stderr
    torchrun = shlex.split(dry.stdout)
    assert torchrun[torchrun.index("--rdzv-endpoint") + 1] == "store-host:29555"
    assert torchrun[torchrun.index("--rdzv-conf") + 1].startswith("is_host=0,")
