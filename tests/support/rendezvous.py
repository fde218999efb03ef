"""What tests/unit/test_rendezvous_store.py and tests/distributed/test_rendezvous_store.py share: the rendezvous
store started as a process of its own, and a wait for its ready line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.processes import clean_env, wait_for
from support.repo import REPO_ROOT


def start_store(port: int, log: Path) -> subprocess.Popen[str]:
    with log.open("a") as sink:
        return subprocess.Popen([sys.executable, "-m", "distqa.launch.rendezvous_store", "--host", "127.0.0.1",
                                 "--port",
                                 str(port)], cwd=REPO_ROOT, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)


def wait_for_line(log: Path, text: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until ``text`` is in ``log`` (the store's ready line); fails at once if the process ended."""
    def ready() -> bool:
        assert process.poll() is None, log.read_text()
        return text in log.read_text()

    wait_for(ready, timeout=timeout)
