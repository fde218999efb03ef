"""The processes the tests start and wait for: an environment without torchrun's variables, free ports, a poll
with a hang guard, a node or a command's ``main`` run in this process, and ``prepare`` in a process of its own."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar
from unittest import mock

from support.repo import REPO_ROOT

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without torchrun or DISTQA_* variables that would leak in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DISTQA_") and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                         "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK"}}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **extra)
    return env


def node_in_process(argv: Sequence[str], env: dict[str, str],
                    agent_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``scripts/worker.sh ARGV`` under ``env`` as what it runs, distqa.launch.node.main, in this process (no bash, no
    interpreter start): its exit status and output. For what ends before the agent starts (--dry-run, a refusal), or,
    given ``agent_env``, up to the agent, which is not started: ``agent_env`` gets the environment it would have
    found. tests/launchers/test_launchers.py and each engine's file keep cases through worker.sh itself."""
    from distqa.launch import node  # only the tests that run a node in process pay for the launcher's imports

    def agent(args: list[str]) -> int:
        assert agent_env is not None
        agent_env.update(os.environ)
        return 0

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), mock.patch.object(sys, "path", list(sys.path)), \
            mock.patch.object(node, "run_agent", agent), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        status = node.main(list(argv))
    return subprocess.CompletedProcess(["scripts/worker.sh", *argv], status, out.getvalue(), err.getvalue())


def wait_for(condition: Callable[[], T | None], timeout: float) -> T:
    """Poll ``condition`` every 0.2 s until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {condition}")


@contextlib.contextmanager
def root_logging_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before the block. A command's ``main`` run in the test's
    process configures logging for a process of its own (``setup_logging``: ``basicConfig(force=True)``, a handler on
    the standard error of that moment, pytest's capture, closed when the test ends); left in place, every later log
    line in this worker ends in a "--- Logging error ---" traceback on standard error."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


def run_prepare(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m distqa.prepare ARGS`` in a process of its own, as the launchers run it; it must succeed."""
    prepared = subprocess.run([sys.executable, "-m", "distqa.prepare", *args], cwd=REPO_ROOT,
                              env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, f"distqa.prepare failed ({prepared.returncode}):\n{prepared.stderr}"
    return prepared
