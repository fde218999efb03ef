"""What every tier's tests share: the machinery task's arguments, a clean environment, free ports, waits, a node run in
this process, the fixtures, and the scheduling of the long tests. The launch helpers (real torchrun runs, emulated
nodes) are tests/distributed/conftest.py's."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = str(REPO_ROOT / "scripts" / "worker.sh")
IN_A_FORK = (REPO_ROOT / "fork.toml").is_file()
"""This checkout is a fork (make new-fork, docs/FORKING.md): the files a fork owns (README.md, project.toml,
.neuro/project.yml) hold its values, not the template's, and the parts it left out are gone."""
T = TypeVar("T")

# The machinery's task: tests whose claim is about distribution, faults, launchers, checkpoints, tracking or hangs
# train the example fork's text classifier (examples/text_classification: torch only, a bag of words with dropout,
# an accuracy that keeps best.pt, 960 training texts), not the QA model. Runs take a second or two of training.
MACHINERY_TASK = "examples.text_classification.task:TextClassification"
MACHINERY_ARGS = [
    "--task", MACHINERY_TASK, "--preset", "none",
    "--progress-bar", "false", "--tensorboard", "false", "--log-every", "1", "--warmup-steps", "2",
]
EXAMPLE = REPO_ROOT / "examples" / "text_classification"
EXAMPLE_PRESET = str(EXAMPLE / "preset.toml")
REVIEWS = EXAMPLE / "reviews.tsv"


def reviews(directory: Path, lines: int) -> list[str]:
    """``--data-file`` for the machinery task's first ``lines`` reviews, written under ``directory``: with
    ``validation_fraction`` 0.2, 80 lines leave 64 training texts (an epoch in a few steps)."""
    path = directory / f"reviews-{lines}.tsv"
    path.write_text("".join(REVIEWS.read_text(encoding="utf-8").splitlines(keepends=True)[:lines]), encoding="utf-8")
    return ["--data-file", str(path)]


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
    from distqa.launch import node

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


def assert_close_values(actual: Any, expected: Any, rel: float = 1e-6) -> None:
    """``actual`` equals ``expected`` (JSON-like: dicts, lists, strings, integers) except that floats need only agree to
    ``rel``: another CPU's kernels round the last bits their own way (a threshold tuned on logits differs by 3e-8)."""
    if isinstance(expected, float) or isinstance(actual, float):
        assert actual == pytest.approx(expected, rel=rel, abs=1e-9), (actual, expected)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), (actual, expected)
        for key in expected:
            assert_close_values(actual[key], expected[key], rel)
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), (actual, expected)
        for got, want in zip(actual, expected, strict=True):
            assert_close_values(got, want, rel)
    else:
        assert actual == expected, (actual, expected)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name in [k for k in os.environ if k.startswith("DISTQA_")]:
        monkeypatch.delenv(name)


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


@pytest.fixture(autouse=True)
def _root_logging_put_back() -> Iterator[None]:
    """Every test leaves the root logger as it found it (:func:`root_logging_kept`), whatever its commands did."""
    with root_logging_kept():
        yield


@pytest.fixture(scope="session", autouse=True)
def _temporary_folders_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TMPDIR of every process the tests start: a folder of pytest's basetemp (pytest keeps the last three sessions'),
    not /tmp. torchrun's agent makes a ``torchelastic_*`` folder there at every start and never removes it, and a
    node the tests SIGKILL leaves worker.sh's stop-report folder: hundreds of folders a run of the suite."""
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmpdir"))


@pytest.fixture
def run_main(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
             no_torchrun_env: None) -> Callable[..., tuple[int, str, str]]:
    """``run_main(module.main, *args)``: a command's ``main`` called in this process (``python -m distqa.X`` exits
    with what ``main`` returns), with no torchrun variables: its exit code, standard output, and standard error
    followed by the log lines at INFO (under pytest a command's ``logging.basicConfig`` adds no handler, so pytest's
    own holds them; a command that configures logging with ``force=True`` keeps its lines on standard error). The
    same code path as ``python -m`` with one interpreter start-up less; an uncaught exception fails the test as a
    traceback would. The root logger is put back after each call (:func:`root_logging_kept`)."""
    def run(main: Callable[[list[str]], int], *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        caplog.clear()
        with root_logging_kept(), caplog.at_level(logging.INFO):
            code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err + caplog.text
    return run


def run_prepare(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m distqa.prepare ARGS`` in a process of its own, as the launchers run it; it must succeed."""
    prepared = subprocess.run([sys.executable, "-m", "distqa.prepare", *args], cwd=REPO_ROOT,
                              env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, f"distqa.prepare failed ({prepared.returncode}):\n{prepared.stderr}"
    return prepared


@pytest.fixture
def group_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A gloo process group of this process alone (for DDP's wrap and buckets in process); destroyed afterwards."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture
def unwritable_mount() -> Iterator[tuple[Path, list[str]]]:
    """A mount like the ones `neuro-flow mkvolumes` makes: root-owned, mode 755, and the command prefix
    that runs a script as the image's former user (uid 1000). Not root: an own folder of mode 555."""
    base = Path(tempfile.mkdtemp(prefix="distqa-mount-", dir="/tmp"))
    base.chmod(0o755)  # traversable by uid 1000 (pytest's own tmp folders are 700)
    mount = base / "results"
    mount.mkdir(mode=0o755)
    if os.geteuid() == 0:
        prefix = ["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups"]
    else:
        mount.chmod(0o555)
        prefix = []
    try:
        yield mount, prefix
    finally:
        mount.chmod(0o755)
        shutil.rmtree(base)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``long`` (minutes each) start first, spread over the xdist workers. xdist's worksteal hands
    worker w the w-th contiguous share of the collection (``WorkStealingScheduling.check_schedule``: the first idle
    node gets len // workers, the next len // the rest, ...), and a worker that runs dry steals the tail of another's
    queue: a long test at a share's tail would run last, on one worker, while the others have nothing left. So
    each share here starts with its long tests (dealt in collection order, one per worker in turn), then takes the
    other tests in their order."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    long_tests = [item for item in items if item.get_closest_marker("long")]
    if workers < 2 or not long_tests:
        return
    others = iter(item for item in items if not item.get_closest_marker("long"))
    reordered: list[pytest.Item] = []
    left = len(items)
    for worker in range(workers):
        share = left // (workers - worker)
        head = long_tests[worker::workers][:share]
        reordered += head + [next(others) for _ in range(share - len(head))]
        left -= share
    reordered += list(others)
    assert sorted(map(id, reordered)) == sorted(map(id, items))
    items[:] = reordered
