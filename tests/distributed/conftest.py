"""The distributed tier's helpers: real launches of the trainer (``python -m distqa.train``, torchrun, an emulated
node's ``scripts/worker.sh``), their hang guards, and the runs several test files check, made once per test session.

Every test collected under tests/distributed/ is marked ``distributed`` here (``make test-fast`` leaves them out). A
test of another tier that needs a launch helper imports it from here (``from distributed.conftest import ...``: this
folder is a package, so that its conftest is ``distributed.conftest`` and ``from conftest import ...`` still names
tests/conftest.py). No test file imports another (tests/unit/test_structure.py checks it): what two files share lives
here, in tests/conftest.py or in a helper module at tests/.

A run that more than one module compares against (the uninterrupted 3-rank elastic run) is made by
:func:`once_per_session`: under pytest-xdist the first worker to ask runs it while the others wait for its record,
so it costs one run whichever workers take the modules.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from distqa.config.sources import load_config
from distqa.distributed.rng import seed_everything
from distqa.tasks import make_task

from conftest import MACHINERY_ARGS, REPO_ROOT, WORKER, clean_env, reviews

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/distributed/ is marked ``distributed`` by its folder (before ``-m`` selects): it starts
    real multi-process torchrun/gloo runs. tests/unit/test_structure.py checks that no other tier is marked so."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.distributed)


AT_STEP = """
import os, signal, sys, time
from distqa.training.trainer import Trainer
from distqa.train import main

train_step = Trainer.train_step


def act_once_at_step(self, micro_batches):  # the run's own step; at a known step of one rank, the test's action
    acted = os.environ.get("ACTED_FILE")  # once per run across processes (a worker restarted by torchrun)
    rank = os.environ.get("RANK", "0")
    if self.progress.step == int(os.environ["AT_STEP"]) and rank == os.environ.get("AT_RANK", "0") \
            and os.environ.get("AT_RUN", self.run_dir.name) == self.run_dir.name \
            and not os.environ.get("ACTED") and not (acted and os.path.exists(acted)):
        os.environ["ACTED"] = "1"
        if acted:
            open(acted, "w").close()
        if os.environ["SIGNAL"] == "RAISE":
            raise RuntimeError("a crash the test injected")
        target = os.environ["TARGET_PID"]  # "self", "parent" (the torchrun agent), a pid (negative: a group)
        pid = {"self": os.getpid(), "parent": os.getppid()}.get(target) or int(target)
        os.kill(pid, getattr(signal, os.environ["SIGNAL"]))
        # The agent forwards it to this worker (AT_WAIT_STOP: so does the launcher the pid runs, a sweep's): hold the
        # step until it is here, however slow.
        if target == "parent" or os.environ.get("AT_WAIT_STOP"):
            # the StopSignal distqa.distributed.stop installed
            stop = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
            deadline = time.monotonic() + 120
            while not stop.received and time.monotonic() < deadline:
                time.sleep(0.01)
    return train_step(self, micro_batches)


Trainer.train_step = act_once_at_step
sys.exit(main())
"""
"""``python -m distqa.train`` that, at optimizer step AT_STEP of rank AT_RANK (default 0), sends SIGNAL to
TARGET_PID (or raises): a signal at a step the run reaches, with no race with the clock. AT_RUN: only in the run
directory of that name (a sweep's trial-001). Write it to ``at_step.py``
in a folder on PYTHONPATH and start it as the launchers' ``--entry-module at_step`` (tests/distributed/test_tracking.py,
tests/distributed/test_training.py)."""


def initial_weights(*args: str) -> dict[str, torch.Tensor]:
    """The weights a run of the machinery task with ``args`` starts from (built as distqa.train builds them)."""
    config = load_config([*MACHINERY_ARGS, *args], environ={}, dotenv_path=os.devnull)
    seed_everything(config.seed)
    return make_task(config).build_model().state_dict()


def run_training(args: list[str], nproc: int = 1, cwd: Path = REPO_ROOT, timeout: int = 240,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m distqa.train`` in a fresh process, or under ``torchrun --standalone`` for nproc > 1."""
    result = subprocess.run(training_command(nproc) + args, cwd=cwd, env=env or clean_env(OMP_NUM_THREADS="1"),
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        # The lines that say why first: a CI report may keep only the start and the end of a long output.
        why = [line for line in result.stderr.splitlines() if FAILURE_LINE.search(line)][:12]
        raise AssertionError(f"training failed ({result.returncode}):\n" + "".join(f"  {line}\n" for line in why)
                             + f"{result.stdout}\n{result.stderr}")
    return result


FAILURE_LINE = re.compile(r"terminate called|what\(\):|Fatal Python error|Error:|error:|exitcode *: *-?[1-9]")
"""Lines of a failed run's output that name its cause: a C++ abort, a Python exception, torchrun's failure table."""


def start_training(args: list[str], log: Path, nproc: int = 1, cwd: Path = REPO_ROOT,
                   env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """:func:`run_training`'s run in the background (a reference run beside the one a test interrupts), its output
    appended to ``log``, in a session of its own (``os.killpg`` ends it with its workers)."""
    with log.open("a") as sink:
        return subprocess.Popen(training_command(nproc) + args, cwd=cwd, env=env or clean_env(OMP_NUM_THREADS="1"),
                                stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def training_command(nproc: int) -> list[str]:
    """``python -m distqa.train``, under ``torchrun --standalone`` for nproc > 1."""
    if nproc == 1:
        return [sys.executable, "-m", "distqa.train"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m",
            "distqa.train"]


def start_node(node_rank: int, nnodes: int, port: int, run_id: str, output_dir: Path, *extra: str,
               trainer_args: Sequence[str] = ("--max-steps", "2"), **env: str) -> subprocess.Popen[str]:
    """One emulated node: ``scripts/worker.sh`` with one process on 127.0.0.1, in a session of its own
    (``os.killpg`` ends the whole node: worker.sh, its torchrun agent and its workers). Its output is
    appended to ``output_dir/<run_id>-node-<node_rank>.out`` (a file, not a pipe that could fill up). It trains the
    machinery task; ``env`` adds variables (INJECT_FAULT)."""
    with node_output(output_dir, run_id, node_rank).open("a") as sink:
        return subprocess.Popen(
            ["bash", WORKER, "--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
             "--master-port", str(port), "--run-id", run_id, "--nproc-per-node", "1", *extra, "--",
             *MACHINERY_ARGS, "--output-dir", str(output_dir), *trainer_args],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1", OMP_NUM_THREADS="1", **env),
            stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def node_output(output_dir: Path, run_id: str, node_rank: int) -> Path:
    return output_dir / f"{run_id}-node-{node_rank}.out"


def finish(process: subprocess.Popen[str], timeout: float) -> None:
    """Wait for ``process``; it and its session are SIGKILLed after ``timeout`` s."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def sigint_as_in_a_terminal() -> None:
    """SIGINT back to its default in the launcher, as a terminal's shell gives it. A command started in the background
    by a non-interactive shell (``make test &``, ``nohup``) inherits SIGINT ignored, and bash can neither trap nor
    reset a signal ignored when it starts: the launcher's Ctrl-C handler would never run (seen under a CI run started
    with ``&``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_launcher(launcher: subprocess.Popen, output_dir: Path | None = None) -> None:
    """SIGKILL a launcher that still runs (a test's hang guard, after a failure) and every process under it. The
    local launcher starts each node in a session of its own (a terminal's Ctrl-C must reach the launcher alone), so
    ``os.killpg`` on the launcher would leave its nodes running: they are found as its descendants first, and, with
    ``output_dir``, as any live process with it in its command line (a node's agent or worker whose parent died
    before, no longer under the launcher)."""
    if launcher.poll() is not None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        processes = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    for pid in processes_of(output_dir) if output_dir else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_of(output_dir: Path) -> list[int]:
    """Live processes with ``output_dir`` in their command line: a node's worker.sh, agent and workers."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and str(output_dir).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found


def training_process(rank: int, output_dir: Path, module: str = "distqa.train") -> int | None:
    """PID of a live worker of ``module`` with RANK=rank whose --output-dir is ``output_dir`` (a test's
    tmp_path, so that another test run on the same machine is never the one signalled); not its agent."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in cmdline and b"distqa.launch.agent" not in cmdline \
                and b"torch.distributed.run" not in cmdline \
                and f"RANK={rank}".encode() in environ and str(output_dir).encode() in cmdline:
            return int(proc.name)
    return None


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    assert checkpoints, f"no checkpoint in {run_dir}"
    return torch.load(checkpoints[-1], map_location="cpu", weights_only=True)["model"]


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str,
                     produce: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """``produce(folder)``'s record (JSON), made once per session under ``<session>/<name>/`` however many xdist
    workers ask; the folder and the record."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder either way
    folder, record = shared / name, shared / name / "record.json"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            folder.mkdir(exist_ok=True)
            record.write_text(json.dumps(produce(folder)))
    return folder, json.loads(record.read_text())


# The elastic runs (tests/distributed/test_elastic.py, tests/distributed/test_rendezvous_store.py). 12 examples per
# step: 2 per rank × 3 ranks × 2 micro-batches, or × 2 ranks × 3. Dropout off: the weights of a run that changed its
# world size equal the uninterrupted run's (dropout masks are drawn per rank).
ELASTIC_TRAINER_ARGS = ("--max-steps", "14", "--checkpoint-every", "4", "--global-batch-size", "12",
                        "--per-rank-batch-size", "2", "--classifier-dropout", "0", "--stop-check-every", "1")


# Short rendezvous timings (worker.sh passes them to torchrun's c10d rendezvous): a round completes 1 s after its
# minimum has joined, and a dead node leaves the rendezvous after 3 missed 1-s heartbeats.
RENDEZVOUS = {"RDZV_LAST_CALL_TIMEOUT": "1", "RDZV_KEEP_ALIVE_INTERVAL": "1", "RDZV_KEEP_ALIVE_MAX_ATTEMPT": "3"}


# One restart: the lost node and its return are membership changes, which spend none (distqa.launch.agent gives back
# the restart its survivors' exit 76 cost, distqa.training.peer_loss), so a run that lost a node and got it back still
# has it.
ELASTIC_NODE_ARGS = ("--min-nodes", "2", "--max-restarts", "1", "--join-timeout", "60")


def reference_run(tmp_path_factory: pytest.TempPathFactory, args: Sequence[str], nproc: int) -> Path:
    """The run directory of an uninterrupted run of the machinery task with the training arguments ``args`` (no
    --output-dir or --run-name) on ``nproc`` ranks (:func:`run_training`): made once per session and keyed by its
    arguments, so every test that compares a run it interrupted with the same training shares it, whichever file and
    worker asks first. The others wait for it; a test that starts its own runs first has them train beside it."""
    key = hashlib.sha256(json.dumps([nproc, *args]).encode()).hexdigest()[:12]

    def train(folder: Path) -> dict[str, Any]:
        run_training([*MACHINERY_ARGS, *args, "--output-dir", str(folder), "--run-name", "uninterrupted"], nproc=nproc)
        return {"args": list(args), "nproc": nproc}

    folder, _ = once_per_session(tmp_path_factory, f"reference-{key}", train)
    return folder / "uninterrupted"


def shared_reviews(tmp_path_factory: pytest.TempPathFactory, lines: int) -> list[str]:
    """:func:`conftest.reviews`' ``--data-file`` arguments, the file written once per session: the same arguments in
    every file, so that the runs training on it can share their reference (:func:`reference_run`)."""
    _, record = once_per_session(tmp_path_factory, f"reviews-{lines}", lambda folder: {"args": reviews(folder, lines)})
    return record["args"]


def elastic_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted 3-rank run every elastic run ends equal to (tests/distributed/test_elastic.py,
    tests/distributed/test_rendezvous_store.py)."""
    return reference_run(tmp_path_factory, ELASTIC_TRAINER_ARGS, nproc=3)


def forty_steps_of_2_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The training of the runs that a kill, a lost node or a stop interrupts (tests/distributed/test_training.py,
    test_faults.py, test_node_loss.py): 2 ranks of 4, dropout on; 320 reviews (256 training texts), 32 steps an
    epoch, so 40 steps cross an epoch boundary. Checkpoints and stop checks are each test's own (they change no
    weight): their reference, :func:`forty_steps_uninterrupted`, saves at its end only."""
    return ["--max-steps", "40", "--global-batch-size", "8", "--per-rank-batch-size", "4", "--classifier-dropout",
            "0.1", *shared_reviews(tmp_path_factory, 320)]


def forty_steps_uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of :func:`forty_steps_of_2_ranks` never interrupted, once per session."""
    return reference_run(tmp_path_factory, [*forty_steps_of_2_ranks(tmp_path_factory), "--checkpoint-every", "0"],
                         nproc=2)


# The sharded runs' arguments (tests/distributed/test_sharding.py, tests/distributed/test_sharding_resume.py): the
# machinery task, the same global batch of 16 with accumulation and clipping on, DDP's file layout for every strategy
# (compared key by key).
SHARDING_STEPS = 4


SHARDING_MAX_GRAD_NORM = 0.3


def sharding_run_args(data: list[str], output_dir: Path, name: str, per_rank: int, *extra: str) -> list[str]:
    return [*MACHINERY_ARGS, *data, "--output-dir", str(output_dir), "--run-name", name, "--global-batch-size", "16",
            "--per-rank-batch-size", str(per_rank), "--max-steps", str(SHARDING_STEPS), "--checkpoint-every", "2",
            "--classifier-dropout", "0", "--lr", "5e-4", "--max-grad-norm", str(SHARDING_MAX_GRAD_NORM),
            "--eval-every", "2", "--eval-batch-size", "4", "--dist-timeout-s", "60", "--checkpoint-format", "file",
            *extra]
