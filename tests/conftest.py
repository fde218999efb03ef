"""Every tier's fixtures and pytest hooks; the helpers the tests import by name are in tests/support/ (``from
support.processes import clean_env``). Here: no torchrun variables, a command's ``main`` run in this process, a gloo
group of one, a mount like the platform's, the root logger put back after each test, temporary folders under
pytest's basetemp, and the scheduling of the long tests."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from support.processes import free_port, root_logging_kept


@pytest.fixture
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name in [k for k in os.environ if k.startswith("DISTQA_")]:
        monkeypatch.delenv(name)


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
