"""What tests/launchers/test_platform.py and tests/distributed/test_platform.py share (template.toml's part
apolo): the stand-in platform (tests/standin/platform_cli.py behind neuro-flow and apolo-flow on PATH), the
launcher started against it, and its jobs and events. Its fixture ``platform`` is imported by name
(``platform_fixture``) into each file that takes it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.processes import clean_env, free_port
from support.repo import REPO_ROOT
from support.runs import sigint_as_in_a_terminal

STANDIN = REPO_ROOT / "tests" / "standin" / "platform_cli.py"
LAUNCH = REPO_ROOT / "scripts" / "run_distributed_on_platform.sh"
LAUNCHER = [sys.executable, "-m", "distqa.launch.platform"]
"""What the script execs: the launcher without the shim (one process less per case)."""


# --- the launcher against the stand-in platform -------------------------------------------------

def start_platform(tmp_path: Path) -> dict[str, str]:
    """PATH with stand-in neuro-flow / apolo-flow first, volumes created and uploaded as a user would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("neuro-flow", "apolo-flow"):
        wrapper = bin_dir / name
        wrapper.write_text(f"#!/bin/sh\nSTANDIN_CLI_NAME={name} exec {shlex.quote(sys.executable)} "
                           f"{shlex.quote(str(STANDIN))} \"$@\"\n")
        wrapper.chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}", STANDIN_PLATFORM_DIR=str(tmp_path / "platform"),
                    STANDIN_PENDING_S="1")
    for command in (["mkvolumes"], ["upload", "ALL"]):
        subprocess.run(["neuro-flow", *command], cwd=REPO_ROOT, env=env, check=True, capture_output=True, timeout=120)
    return env


def stop_platform(env: dict[str, str]) -> None:
    subprocess.run(["neuro-flow", "kill", "ALL"], cwd=REPO_ROOT, env=env, capture_output=True, timeout=120)


@pytest.fixture(name="platform")
def platform_fixture(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A stand-in platform of the test's own (:func:`start_platform`); every job left is killed at the end."""
    env = start_platform(tmp_path)
    yield env
    stop_platform(env)


def launch(env: dict[str, str], run_id: str, *extra: str, nodes: int = 2, cwd: Path = REPO_ROOT,
           output: Path | None = None, script: bool = False) -> subprocess.Popen[str]:
    """The launcher in the background (``script``: through scripts/run_distributed_on_platform.sh); its output to a
    pipe that :func:`finish` reads, or to ``output`` (a file a test can read while the launcher runs). It looks at the
    jobs every 2 s: each look is one `ps` of the stand-in, which renders its table with neuro-flow's own code (about
    1 CPU-s, as the real CLI's start)."""
    with contextlib.ExitStack() as files:
        sink = files.enter_context(output.open("w")) if output else subprocess.PIPE
        return subprocess.Popen([*(["bash", str(LAUNCH)] if script else LAUNCHER), "--nodes", str(nodes), "--run-id",
                                 run_id, "--port", str(free_port()), "--poll", "2", *extra],
                                cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, preexec_fn=sigint_as_in_a_terminal)


def finish(launcher: subprocess.Popen[str], timeout: float) -> str:
    """The launcher's output (empty when it went to a file), once it has ended; SIGKILLed after ``timeout`` s, and
    then the test fails with what it printed (a hang's only record: the jobs' logs go with the test's folder)."""
    timed_out = False
    try:
        output, _ = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            output, _ = launcher.communicate()
    if timed_out:
        raise AssertionError(f"the launcher did not end within {timeout} s; its output:\n{output}")
    return output


def jobs(env: dict[str, str]) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (Path(env["STANDIN_PLATFORM_DIR"]) / "jobs").glob("*.json")}


def events(env: dict[str, str]) -> list[dict]:
    """The stand-in platform's submissions and status changes, in the order they happened."""
    path = Path(env["STANDIN_PLATFORM_DIR"]) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


STORE = "rendezvous_store"
