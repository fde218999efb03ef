"""The Docker tier's install decision (tests/docker/tools.sh), on PATHs built by the test.

A machine that ships a `docker` client without a daemon must get docker.io installed: deciding from
the client alone left `make test-docker` waiting for a dockerd that was never there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.repo import REPO_ROOT

BASH = shutil.which("bash") or "/bin/bash"
CLIENT_WITHOUT_DAEMON = "#!/bin/sh\n# `docker info` fails as a client does with no daemon to answer\nexit 1\n"
CLIENT_WITH_DAEMON = "#!/bin/sh\nexit 0\n"


def fake_bin(tmp_path: Path, **tools: str) -> Path:
    """A directory holding only the given executables (name -> script); `_` in a name reads as `-`."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for name, script in tools.items():
        tool = directory / name.replace("_", "-")
        tool.write_text(script)
        tool.chmod(0o755)
    return directory


def missing_packages(path: Path) -> str:
    result = subprocess.run([BASH, "-c", "source tests/docker/tools.sh && docker_tier_missing_packages"],
                            cwd=REPO_ROOT, env={"PATH": str(path)}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(("tools", "expected"), [
    ({"docker": CLIENT_WITHOUT_DAEMON}, "docker.io debootstrap"),
    ({}, "docker.io debootstrap"),
    ({"docker": CLIENT_WITHOUT_DAEMON, "debootstrap": CLIENT_WITH_DAEMON}, "docker.io"),
    ({"docker": CLIENT_WITHOUT_DAEMON, "dockerd": CLIENT_WITH_DAEMON, "debootstrap": CLIENT_WITH_DAEMON}, ""),
    ({"docker": CLIENT_WITH_DAEMON, "debootstrap": CLIENT_WITH_DAEMON}, ""),  # a daemon already answers
], ids=["client-only", "nothing", "client-and-debootstrap", "client-and-dockerd", "daemon-answers"])
def test_a_docker_client_without_a_daemon_means_docker_io_is_installed(tools: dict[str, str], expected: str,
                                                                        tmp_path: Path) -> None:
    assert missing_packages(fake_bin(tmp_path, **tools)) == expected


@pytest.mark.parametrize(("apt_exit", "message"), [
    (100, "could not install docker.io debootstrap with apt-get"),
    (0, "apt-get installed the packages but this is still missing: docker.io debootstrap"),
])
def test_the_install_step_says_what_it_could_not_do(apt_exit: int, message: str, tmp_path: Path) -> None:
    calls = tmp_path / "apt-get.calls"
    apt_get = f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = install ] && exit {apt_exit}\nexit 0\n'
    path = fake_bin(tmp_path, docker=CLIENT_WITHOUT_DAEMON, apt_get=apt_get)
    result = subprocess.run([BASH, "-c", "source tests/docker/tools.sh && install_docker_tier_tools"],
                            cwd=REPO_ROOT, env={"PATH": str(path)}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    if os.geteuid() != 0:
        assert "needs docker.io debootstrap; install them" in result.stderr
        return
    assert message in result.stderr, result.stderr
    assert calls.read_text().splitlines()[-1].endswith("install -y -qq docker.io debootstrap")


def test_run_sh_decides_with_tools_sh() -> None:
    script = (REPO_ROOT / "tests" / "docker" / "run.sh").read_text()
    assert "source tests/docker/tools.sh" in script and "install_docker_tier_tools || exit 1" in script
    assert "command -v docker " not in script  # the client alone must not decide


EVENTS_STUB = """#!/bin/bash
# Appends what it was asked to do to $EVENTS; waits (bounded) for another stub's event where the order is the claim.
wait_for() {
    for _ in $(seq 600); do grep -qx "$1" "$EVENTS" && return 0; sleep 0.1; done
    echo "never saw: $1" >> "$EVENTS"
}
"""
PYTHON_STUB = EVENTS_STUB + """if [[ "$*" == "-m pytest "* ]]; then
    echo "pytest start" >> "$EVENTS"; wait_for "build end"; echo "pytest end" >> "$EVENTS"; exit "$PYTEST_EXIT"
fi
"""
DOCKER_TIER_STUB = EVENTS_STUB + """if [[ "$1" == --build-only ]]; then
    echo "build start" >> "$EVENTS"; wait_for "pytest start"; echo "build end" >> "$EVENTS"
else
    echo "2-container run" >> "$EVENTS"
fi
"""


@pytest.mark.parametrize(("pytest_exit", "expected"), [
    (0, ["build start", "pytest start", "build end", "pytest end", "2-container run"]),
    (1, ["build start", "pytest start", "build end", "pytest end"]),
], ids=["suite-passes", "suite-fails"])
def test_make_test_builds_the_docker_tier_beside_the_suite_and_runs_it_after(pytest_exit: int, expected: list[str],
                                                                             tmp_path: Path) -> None:
    """`make test` starts the images' build (minutes on a fresh machine) before the linters and the suite
    and runs the two containers only after both; a failed suite ends it without the container run."""
    tools = fake_bin(tmp_path, python=PYTHON_STUB, ruff="#!/bin/sh\n", lint_imports="#!/bin/sh\n",
                     shellcheck="#!/bin/sh\n", hadolint="#!/bin/sh\n")
    stamps = {}
    # Every venv already installed.
    for name in ("VENV", "FLOW26_VENV", "MLFLOW_VENV", "TRANSFORMERS4_VENV", "SKYPILOT_VENV"):
        directory = tmp_path / name.lower()
        directory.mkdir(exist_ok=True)
        (directory / ".installed").touch()
        stamps[name] = str(directory)
    tools.rename(Path(stamps["VENV"]) / "bin")  # the project venv's python and linters: the stubs
    tier = tmp_path / "docker-tier"
    tier.write_text(DOCKER_TIER_STUB)
    tier.chmod(0o755)
    events = tmp_path / "events"
    events.touch()
    result = subprocess.run(["make", "--no-print-directory", "test", *(f"{k}={v}" for k, v in stamps.items()),
                             f"DOCKER_TIER={tier}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "EVENTS": str(events), "PYTEST_EXIT": str(pytest_exit)})
    assert events.read_text().splitlines() == expected, result.stdout + result.stderr
    assert (result.returncode == 0) == (pytest_exit == 0), result.stdout + result.stderr
