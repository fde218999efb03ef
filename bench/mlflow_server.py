"""A real MLflow tracking server on loopback, from .venv-mlflow (make setup): what bench/tracking_overhead.py times
against and what tests/distributed/test_tracking.py tracks to. Free of any task, so a fork keeps it (template.toml)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

MLFLOW = Path(__file__).resolve().parents[1] / ".venv-mlflow" / "bin" / "mlflow"


@contextlib.contextmanager
def mlflow_server(work: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``mlflow server`` on a free loopback port, its store, artifacts and log (``server.log``) under ``work``;
    its whole session killed on exit. Yields its address and its process (tests/distributed/test_tracking.py uses it
    too)."""
    work.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (work / "server.log").open("wb") as server_log:
        server = subprocess.Popen(
            [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{work}/mlflow.db", "--artifacts-destination",
             str(work / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            cwd=work, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
            # Without its job runner (a process for GenAI jobs, starting beside the server): nothing here uses it.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a hang guard: about 6 s on a quiet 2-core machine
        while not healthy(uri):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the MLflow server on {uri} did not answer within 120 s:\n"
                                   f"{(work / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield uri, server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
