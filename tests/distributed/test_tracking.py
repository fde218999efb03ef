"""``--tracker mlflow`` against a real MLflow tracking server (``mlflow server`` from ``.venv-mlflow``, made by
``make setup``, on 127.0.0.1 with a SQLite store), read back with ``MlflowClient``: a 2-node run stopped by SIGTERM
and resumed is one MLflow run whose parameters are ``config.json`` and whose metrics are the TensorBoard scalars at
the same steps; a run resumed from an earlier checkpoint than its last log logs no step twice; a worker killed before
the first checkpoint and restarted by torchrun, or a run stopped before it and launched again, is still one MLflow
run, with its last partial window logged at the stop; a run left RUNNING by a killed start is ended when a start
with ``--resume none`` replaces it; the status follows how the run ended; a server killed mid-run or never there
costs one warning, not the run or its weights."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from support.compare import final_weights, max_difference
from support.processes import clean_env, free_port
from support.repo import MACHINERY_ARGS, REPO_ROOT
from support.runs import AT_STEP

sys.path.insert(0, str(REPO_ROOT / "bench"))
from mlflow_server import MLFLOW, mlflow_server  # the benchmark's server, started the same way

pytestmark = pytest.mark.skipif(not MLFLOW.exists(), reason="no .venv-mlflow: run `make setup`")
SECRET = "not-to-be-logged-7f3a"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One MLflow server for the module's tests (starting one takes seconds: it creates and migrates its SQLite
    store); each test logs into an experiment of its own name and reads back only that one. The test that kills
    its server starts its own."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as (address, _):
        yield address


def runs_of(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def train(tmp_path: Path, uri: str, *args: str, script: Path | None = None, torchrun: Sequence[str] = (),
          **env: str) -> subprocess.CompletedProcess[str]:
    """One process (``python -m distqa.train`` or ``script``), or under ``torchrun TORCHRUN...`` when given."""
    entry = [str(script)] if script else ["-m", "distqa.train"]
    if torchrun:
        entry = ["-m", "torch.distributed.run", *torchrun, *(entry if script else ["-m", "distqa.train"])]
    return subprocess.run([sys.executable, *entry, *MACHINERY_ARGS, "--output-dir", str(tmp_path),
                           "--progress-bar", "false", "--tracker", "mlflow", *args], cwd=REPO_ROOT,
                          env=clean_env(OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=uri, PYTHONPATH=str(REPO_ROOT), **env),
                          capture_output=True, text=True, timeout=180)  # PYTHONPATH: the task's package, for a script


def test_a_two_node_run_stopped_and_resumed_is_one_mlflow_run_with_its_config_and_tensorboard_scalars(
        tmp_path: Path, uri: str) -> None:
    """2 emulated nodes through the local launcher (the example's task, evaluated every 10 steps); at step 23 rank 0's
    torchrun agent gets SIGTERM (a platform job at its life span): both nodes stop with a checkpoint (exit 75),
    then the launcher run again resumes to the end."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "at_step.py").write_text(AT_STEP)
    run_dir = tmp_path / "tracked"

    def launch(*launcher_args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "scripts/run_distributed_locally.sh", "--nodes", "2", "--port", str(free_port()), "--run-id",
             "tracked", *launcher_args, "--", "--preset",
             str(REPO_ROOT / "examples" / "text_classification" / "preset.toml"), "--output-dir", str(tmp_path),
             "--max-steps", "40", "--eval-every", "10", "--log-every", "5", "--stop-check-every", "2",
             "--tracker", "mlflow", "--mlflow-experiment", "two-nodes", "--progress-bar", "false"],
            cwd=REPO_ROOT, env=clean_env(PYTHON=sys.executable, MLFLOW_TRACKING_URI=uri,
                                         MLFLOW_TRACKING_PASSWORD=SECRET, **env),
            capture_output=True, text=True, timeout=300)

    stopped = launch("--entry-module", "at_step", PYTHONPATH=str(tmp_path), AT_STEP="23", SIGNAL="SIGTERM",
                     TARGET_PID="parent")
    assert stopped.returncode == 75, stopped.stdout + stopped.stderr
    [run] = runs_of(uri, "two-nodes")
    assert run.info.status == "KILLED"
    resumed = launch()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stderr and "at step 24" in resumed.stderr, stopped.stderr + resumed.stderr
    [run] = runs_of(uri, "two-nodes")
    client = MlflowClient(uri)
    config = json.loads((run_dir / "config.json").read_text())
    params = run.data.params
    assert {name: params[name] for name in config} == {name: str(value) for name, value in config.items()}
    assert params["world_size"] == "2" and params["version.torch"].startswith("2.")
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.json", "run.json", "summary.json"}

    scalars = EventAccumulator(str(run_dir / "tensorboard")).Reload()  # both starts' event files
    tags = scalars.Tags()["scalars"]
    assert {"train/loss", "eval/accuracy", "ranks/step_p50_ms/rank_1"} <= set(tags)
    assert set(tags) == set(run.data.metrics)
    for tag in tags:
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag))
        board = sorted((e.step, e.value) for e in scalars.Scalars(tag))
        assert [s for s, _ in logged] == [s for s, _ in board], tag
        assert len({s for s, _ in logged}) == len(logged), f"{tag}: a step logged twice"
        assert [v for _, v in logged] == pytest.approx([v for _, v in board], rel=1e-6), tag  # TB keeps float32
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == 40
    saved = [run_dir / "config.json", run_dir / "run.json", run_dir / "summary.json", *run_dir.glob("logs/*")]
    assert all(SECRET not in path.read_text() for path in saved)
    assert SECRET not in json.dumps(params)


def test_a_run_stopped_by_sigterm_and_resumed_is_one_run_with_no_step_twice(tmp_path: Path, uri: str) -> None:
    script = tmp_path / "at_step.py"
    script.write_text(AT_STEP)
    args = ["--run-name", "stopped", "--mlflow-experiment", "stop", "--max-steps", "30", "--log-every", "2",
            "--checkpoint-every", "5", "--stop-check-every", "2"]
    stopped = train(tmp_path, uri, *args, script=script, AT_STEP="11", SIGNAL="SIGTERM", TARGET_PID="self")
    assert stopped.returncode == 75, stopped.stderr
    [run] = runs_of(uri, "stop")
    assert run.info.status == "KILLED"
    checkpoints = tmp_path / "stopped" / "checkpoints"
    newest = max(checkpoints.glob("step-*.pt"))
    assert newest.name == "step-00000012.pt"  # the stop's own checkpoint, after the step logged last
    for path in checkpoints.glob("step-00000012.pt*"):
        path.unlink()  # resume from step 10: steps 11-12 are trained and logged again
    resumed = train(tmp_path, uri, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "at step 10" in resumed.stderr
    [run] = runs_of(uri, "stop")
    assert run.info.status == "FINISHED"
    client = MlflowClient(uri)
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged a step twice: {sorted(steps)}"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/loss")) == list(range(2, 31, 2))


def steps_logged_once(uri: str, run_id: str, key: str = "train/loss") -> list[int]:
    """The steps of ``key`` in the run, each asserted to be there once, in order."""
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))
    assert len(steps) == len(set(steps)), f"{key}: a step logged twice: {steps}"
    return steps


def test_a_worker_killed_before_the_first_checkpoint_and_restarted_by_torchrun_is_one_mlflow_run(
        tmp_path: Path, uri: str) -> None:
    """--max-restarts 1, checkpoints every 50 steps: rank 0 SIGKILLs itself at step 20 (no checkpoint holds the MLflow
    run's id yet); torchrun restarts it from scratch, and the restart goes on in the same MLflow run (its id in the run
    directory), re-logging none of steps 1-20, and ends it FINISHED."""
    script = tmp_path / "at_step.py"
    script.write_text(AT_STEP)
    args = ["--run-name", "restarted", "--mlflow-experiment", "restart", "--max-steps", "26", "--log-every", "1",
            "--checkpoint-every", "50", "--global-batch-size", "8", "--per-rank-batch-size", "8"]
    result = train(tmp_path, uri, *args, script=script, torchrun=("--standalone", "--nproc-per-node", "1",
                                                                  "--max-restarts", "1"),
                   AT_STEP="20", SIGNAL="SIGKILL", TARGET_PID="self", ACTED_FILE=str(tmp_path / "acted"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "acted").exists(), "the kill happened"
    assert result.stderr.count("starting from scratch") == 2, "the restart had no checkpoint to resume"
    [run] = runs_of(uri, "restart")
    assert run.info.status == "FINISHED"
    assert "left RUNNING by a start that ended without closing it" in result.stderr
    assert steps_logged_once(uri, run.info.run_id) == list(range(1, 27))
    assert json.loads((tmp_path / "restarted" / "tracking.json").read_text())["mlflow_run_id"] == run.info.run_id


def test_a_run_stopped_before_its_first_checkpoint_and_launched_again_is_one_run_with_its_last_window(
        tmp_path: Path, uri: str) -> None:
    """SIGTERM at step 5 (checked every 2 steps: the stop is at step 6, between log lines every 4 steps): the stop
    logs the partial window of steps 5-6 and ends the MLflow run KILLED; launched again, the run goes on in it to
    FINISHED, every log step there once."""
    script = tmp_path / "at_step.py"
    script.write_text(AT_STEP)
    args = ["--run-name", "stopped", "--mlflow-experiment", "stop-early", "--max-steps", "10", "--log-every", "4",
            "--checkpoint-every", "50", "--stop-check-every", "2", "--global-batch-size", "8",
            "--per-rank-batch-size", "8"]
    stopped = train(tmp_path, uri, *args, script=script, AT_STEP="5", SIGNAL="SIGTERM", TARGET_PID="self")
    assert stopped.returncode == 75, stopped.stderr
    [run] = runs_of(uri, "stop-early")
    assert run.info.status == "KILLED"
    assert steps_logged_once(uri, run.info.run_id) == [4, 6]
    resumed = train(tmp_path, uri, *args)
    assert resumed.returncode == 0, resumed.stderr
    [run] = runs_of(uri, "stop-early")
    assert run.info.status == "FINISHED"
    assert steps_logged_once(uri, run.info.run_id) == [4, 6, 8, 10]


OPENED_BEFORE_EACH_STEP = """
import os, time
from pathlib import Path
from distqa.training.trainer import Trainer

opened_step = Trainer.train_step


def step_once_opened(self, micro_batches):  # each step waits until the MLflow run's id is in tracking.json: a kill
    opened = Path(os.environ["TRACKING_FILE"])  # at a step then finds the run opened and recorded, however slowly
    deadline = time.monotonic() + 120           # the server answered (a hang guard only)
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return opened_step(self, micro_batches)


Trainer.train_step = step_once_opened
"""
"""Put before AT_STEP: its action at a step comes after the wait of every step before it."""


def test_a_run_left_running_by_a_killed_start_is_ended_failed_when_a_fresh_start_replaces_it(
        tmp_path: Path, uri: str) -> None:
    """A start SIGKILLed at step 3 (no checkpoint; its MLflow run, open and named in tracking.json, left RUNNING); a
    start with --resume none in the same run directory opens a new MLflow run and ends the one left RUNNING as
    FAILED."""
    script = tmp_path / "at_step.py"
    script.write_text(OPENED_BEFORE_EACH_STEP + AT_STEP)
    args = ["--run-name", "replaced", "--mlflow-experiment", "replace", "--max-steps", "6", "--log-every", "1",
            "--checkpoint-every", "50", "--global-batch-size", "8", "--per-rank-batch-size", "8"]
    killed = train(tmp_path, uri, *args, script=script, AT_STEP="3", SIGNAL="SIGKILL", TARGET_PID="self",
                   TRACKING_FILE=str(tmp_path / "replaced" / "tracking.json"))
    assert killed.returncode == -9, killed.stderr
    [left] = runs_of(uri, "replace")
    assert left.info.status == "RUNNING"
    fresh = train(tmp_path, uri, *args, "--resume", "none")
    assert fresh.returncode == 0, fresh.stderr
    runs = {run.info.run_id: run.info.status for run in runs_of(uri, "replace")}
    assert len(runs) == 2 and runs.pop(left.info.run_id) == "FAILED"
    assert list(runs.values()) == ["FINISHED"]
    [new] = runs
    assert steps_logged_once(uri, new) == list(range(1, 7))


def test_a_server_killed_mid_run_or_never_there_costs_one_warning_not_the_run(tmp_path: Path) -> None:
    script = tmp_path / "at_step.py"
    script.write_text(AT_STEP)
    # The runs that need no server train beside the one that does, while its server starts and the client's retries
    # wait. Nothing listens on the port held here (bound, not listening): no server started meanwhile can take it.
    with ThreadPoolExecutor(2) as beside, socket.socket() as nothing_there:
        nothing_there.bind(("127.0.0.1", 0))
        untracked = beside.submit(
            subprocess.run, [sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--output-dir", str(tmp_path),
                             "--run-name", "untracked", "--max-steps", "12", "--log-every", "2", "--progress-bar",
                             "false"], cwd=REPO_ROOT, env=clean_env(OMP_NUM_THREADS="1"), capture_output=True,
            text=True, timeout=180)
        never = beside.submit(train, tmp_path, f"http://127.0.0.1:{nothing_there.getsockname()[1]}", "--run-name",
                              "never", "--max-steps", "12", "--log-every", "2")
        with mlflow_server(tmp_path / "server") as (uri, server):
            killed = train(tmp_path, uri, "--run-name", "killed", "--max-steps", "12", "--log-every", "2",
                           script=script, AT_STEP="5", SIGNAL="SIGKILL",
                           TARGET_PID=str(-server.pid))  # the server's whole session
        untracked, never = untracked.result(), never.result()
    assert untracked.returncode == 0, untracked.stderr
    for result, name in ((killed, "killed"), (never, "never")):
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
        assert len(warnings) == 1 and "MLflow tracking at http://127.0.0.1:" in warnings[0], warnings
        assert "training goes on without it" in warnings[0]
        assert max_difference(final_weights(tmp_path / name), final_weights(tmp_path / "untracked")) == 0


def test_a_run_that_crashes_ends_its_mlflow_run_as_failed(tmp_path: Path, uri: str) -> None:
    script = tmp_path / "at_step.py"
    script.write_text(AT_STEP)
    crashed = train(tmp_path, uri, "--run-name", "crashed", "--mlflow-experiment", "crash", "--max-steps", "12",
                    script=script, AT_STEP="3", SIGNAL="RAISE", TARGET_PID="self")
    assert crashed.returncode != 0 and "a crash the test injected" in crashed.stderr
    [run] = runs_of(uri, "crash")
    assert run.info.status == "FAILED"
    assert json.loads((tmp_path / "crashed" / "summary.json").read_text())["status"] == "FAILED"


def test_mlflow_without_a_tracking_uri_is_refused_in_one_line() -> None:
    env = {k: v for k, v in clean_env().items() if k != "MLFLOW_TRACKING_URI"}
    result = subprocess.run([sys.executable, "-m", "distqa.train", *MACHINERY_ARGS, "--tracker", "mlflow"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "distqa.train: configuration error: tracker: 'mlflow' needs MLFLOW_TRACKING_URI (the server's http(s) "
        "address) in the environment or .env; or --tracker none."]
