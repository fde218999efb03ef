"""A run's record outside its directory: every scalar the trainer writes goes to TensorBoard and, with
``--tracker mlflow``, to the MLflow tracking server at ``MLFLOW_TRACKING_URI``, at the same steps. Rank 0 alone
records. What MLflow gets (the resolved config after ``grow_global_batch`` as parameters, the scalars, the small
files as artifacts, the status) and how one MLflow run spans a training run's restarts (its id in the checkpoints'
progress and, from its opening on, in the run directory's ``tracking.json``, written atomically; the steps a restart
logs again dropped; a run an earlier start left RUNNING taken over, or with ``--resume none`` ended as FAILED):
docs/PLATFORM.md, "Tracking with MLflow".

Tracking never costs a run (the same page says how): the server's requests time out after
``MLFLOW_HTTP_REQUEST_TIMEOUT`` s (10 unless set) with ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` retries (2 unless set),
and the end of the run waits at most ``FINISH_TIMEOUT_S`` for the last calls. Credentials (``MLFLOW_TRACKING_USERNAME``/
``PASSWORD``/``TOKEN``) are read by the MLflow client from the environment or ``.env``; nothing here logs them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from distqa.checkpoint.files import write_json
from distqa.checkpoint.format import Progress
from distqa.config import Config
from distqa.distributed.runtime import Runtime
from distqa.distributed.stop import TrainingStoppedError
from distqa.record.rundir import git_sha, versions

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 15.0
"""How long the start waits for the MLflow run to be opened, so that the first checkpoint holds its id (a run opened
later is found by a restart all the same: its id goes to the run directory's tracking.json when it opens)."""
FINISH_TIMEOUT_S = 30.0
"""How long the end of a run waits for the tracking thread's last calls (then the run ends without them)."""


class MLflowTracker:
    """Rank 0's connection to an MLflow tracking server; every request runs on its own thread, in order."""

    def __init__(self, uri: str, experiment: str, run_name: str, run_id: str | None,
                 params: dict[str, str], on_run_id: Callable[[str], None], leftover: str | None = None,
                 tags: dict[str, str] | None = None) -> None:
        """``run_id``: the MLflow run to go on in (a resumed or restarted training run), None to open one.
        ``on_run_id`` is called with the run's id once it is open. ``leftover``: an earlier start's run that this one
        does not go on in (``--resume none``); ended as FAILED if that start left it RUNNING. ``tags``: of a new run
        (``mlflow.parentRunId``: a sweep's trial is a child of the sweep's run)."""
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # the log line below says it
        # One warning line when the server is gone, ours, not one per retry from the HTTP library.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        self.uri, self.run_id, self._tags = uri, run_id, tags or {}
        self._resumed = run_id is not None
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._metrics: list[tuple[str, float, int, int]] = []  # (key, value, timestamp ms, step), not yet sent
        self._logged_up_to: dict[str, int] = {}  # per key, the last step the server has (a resumed run)
        self._failed = False
        self._opened = threading.Event()  # set when the run is open, or tracking has failed
        self._thread = threading.Thread(target=self._work, name="mlflow-tracking", daemon=True)
        self._thread.start()
        self._calls.put(lambda: self._open(experiment, run_name, params, on_run_id, leftover))
        # Before the first step (not inside one), so that the first checkpoint holds the id. A slow server costs
        # nothing more (tracking.json gets the id when it opens), so it is no warning; one that fails is, once.
        if not self._opened.wait(OPEN_TIMEOUT_S) and not self._failed:
            log.info("MLflow tracking at %s: no answer within %.0f s; training starts, the run is opened when "
                     "the server answers", uri, OPEN_TIMEOUT_S)

    def log_metric(self, key: str, value: float, step: int) -> None:
        """Queue one scalar; sent with the others of its step (no waiting here)."""
        if not self._failed:  # nothing piles up in a long run whose server has gone
            self._metrics.append((key, float(value), int(time.time() * 1000), step))

    def flush(self) -> None:
        """Hand the queued scalars to the thread (the trainer calls it after each step's scalars)."""
        metrics, self._metrics = self._metrics, []
        if metrics and not self._failed:
            self._calls.put(lambda: self._send(metrics))

    def finish(self, status: str, artifacts: list[Path]) -> None:
        """Send what is left, the artifacts and the status; wait at most FINISH_TIMEOUT_S for it."""
        self.flush()
        self._calls.put(lambda: self._close(status, artifacts))
        self._calls.put(None)
        self._thread.join(FINISH_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("MLflow tracking at %s: the last calls did not end within %.0f s; the run ends without "
                        "them (TensorBoard has everything)", self.uri, FINISH_TIMEOUT_S)

    # --- on the tracking thread ---------------------------------------------------------------
    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            if self._failed:
                continue
            try:
                call()
            except Exception as err:  # any failure of the server or the network ends tracking, not the run
                self._failed = True
                log.warning("MLflow tracking at %s failed (%s: %s); training goes on without it, TensorBoard "
                            "has everything", self.uri, type(err).__name__, (str(err).splitlines() or [""])[0][:200])
                self._opened.set()

    def _open(self, experiment: str, run_name: str, params: dict[str, str], on_run_id: Callable[[str], None],
              leftover: str | None) -> None:
        # Here, not at the top: the MLflow client is imported only by runs that track.
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(self.uri)
        if leftover is not None and self._status(leftover) == "RUNNING":
            self._client.set_terminated(leftover, status="FAILED")
            log.info("MLflow: run %s, left RUNNING by an earlier start of this run directory, ended as FAILED "
                     "(--resume none: this start opens a new MLflow run)", leftover)
        if self.run_id is not None:  # a resumed or restarted run goes on in its own MLflow run
            status = self._status(self.run_id)
            if status is not None:
                self._client.update_run(self.run_id, status="RUNNING")
                taken_over = " (left RUNNING by a start that ended without closing it)" if status == "RUNNING" else ""
                log.info("MLflow: logging into run %s at %s (resumed)%s", self.run_id, self.uri, taken_over)
                on_run_id(self.run_id)
                self._opened.set()
                return
            log.warning("MLflow: run %s of this run directory is not on the server at %s; opening a new run",
                        self.run_id, self.uri)
            self.run_id, self._resumed = None, False
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self.run_id = self._client.create_run(experiment_id, run_name=run_name, tags=self._tags).info.run_id
        on_run_id(self.run_id)
        # The client cuts a batch into requests of MLflow's limits (100 params, 1000 metrics) itself.
        self._client.log_batch(self.run_id, params=[Param(key, value) for key, value in params.items()])
        log.info("MLflow: run %s in experiment %r at %s", self.run_id, experiment, self.uri)
        self._opened.set()

    def _status(self, run_id: str) -> str | None:
        """The run's status on the server; None when the server has no such run (another server, or deleted)."""
        from mlflow.exceptions import MlflowException  # with the client (_open)

        try:
            return self._client.get_run(run_id).info.status
        except MlflowException as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def _send(self, metrics: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric  # with the client (_open)

        self._client.log_batch(self.run_id, metrics=[Metric(key, value, stamp, step) for key, value, stamp, step in
                                                     metrics if step > self._last_logged_step(key)])

    def _last_logged_step(self, key: str) -> int:
        """-1 for a new run; for a resumed one, the last step of ``key`` the server already has (asked once)."""
        if key not in self._logged_up_to:
            history = self._client.get_metric_history(self.run_id, key) if self._resumed else []
            self._logged_up_to[key] = max((metric.step for metric in history), default=-1)
        return self._logged_up_to[key]

    def _close(self, status: str, artifacts: list[Path]) -> None:
        for path in artifacts:
            if path.is_file():
                self._client.log_artifact(self.run_id, str(path))
        self._client.set_terminated(self.run_id, status=status)
        experiment_id = self._client.get_run(self.run_id).info.experiment_id
        log.info("MLflow: run %s ended %s: %s/#/experiments/%s/runs/%s", self.run_id, status, self.uri.rstrip("/"),
                 experiment_id, self.run_id)


class RunRecord:
    """What the trainer records on rank 0: each scalar to TensorBoard and the tracker. On other ranks it holds
    neither, and :attr:`writer` is None so that the trainer does not even build the scalars."""

    def __init__(self, tensorboard: Any = None, tracker: MLflowTracker | None = None) -> None:
        self.tensorboard, self.tracker = tensorboard, tracker

    @property
    def writer(self) -> RunRecord | None:
        return self if self.tensorboard is not None or self.tracker is not None else None

    def add_scalar(self, name: str, value: float, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(name, value, step)
        if self.tracker is not None:
            self.tracker.log_metric(name, value, step)

    def flush(self) -> None:
        """The scalars of a step are all written: send them on."""
        if self.tracker is not None:
            self.tracker.flush()


TRACKING_FILE = "tracking.json"
"""In the run directory: the MLflow run of this training run, written by rank 0 as soon as the run is open."""


def read_tracking_file(run_dir: Path) -> str | None:
    """The MLflow run id that ``run_dir/tracking.json`` names; None when there is none (or it cannot be read:
    then a new MLflow run is opened, which costs a second run, not the training run)."""
    path = run_dir / TRACKING_FILE
    try:
        run_id = json.loads(path.read_text()).get("mlflow_run_id")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as err:
        log.warning("%s cannot be read (%s); a new MLflow run is opened", path, err)
        return None
    return run_id if isinstance(run_id, str) and run_id else None


def tracking_params(config: Config, runtime: Runtime) -> dict[str, str]:
    """What MLflow shows as the run's parameters: the resolved config, the world size, versions, git commit."""
    params = {name: str(value) for name, value in config.to_dict().items()}
    params |= {"world_size": str(runtime.world_size), "git_sha": str(git_sha())}
    params |= {f"version.{name}": str(version) for name, version in versions().items()}
    return params


@contextlib.contextmanager
def run_record(config: Config, runtime: Runtime, run_dir: Path, progress: Progress) -> Iterator[RunRecord]:
    """Rank 0: TensorBoard (``tensorboard``) and the tracker (``tracker``) for the block, which runs the training;
    at its end the summary, the artifacts and the status the block's outcome gives. Other ranks: nothing."""
    if not runtime.is_main_process:
        yield RunRecord()
        return
    tensorboard = None
    if config.tensorboard:
        # Here, not at the top: it imports tensorboard's protobufs, which runs with tensorboard false never need.
        from torch.utils.tensorboard import SummaryWriter

        tensorboard = SummaryWriter(run_dir / "tensorboard")
    tracker = None
    if config.tracker == "mlflow":
        earlier = read_tracking_file(run_dir)
        # The checkpoint's run; before any checkpoint, the run directory's (--resume auto: the same training run).
        run_id = progress.tracking_run_id or (earlier if config.resume == "auto" else None)

        def opened(run_id: str) -> None:
            progress.tracking_run_id = run_id
            write_json(run_dir / TRACKING_FILE, {"mlflow_run_id": run_id,
                                                 "mlflow_experiment": config.mlflow_experiment})

        tracker = MLflowTracker(os.environ["MLFLOW_TRACKING_URI"], config.mlflow_experiment, config.run_name,
                                run_id, tracking_params(config, runtime), on_run_id=opened,
                                leftover=earlier if earlier != run_id else None,
                                tags={"mlflow.parentRunId": config.mlflow_parent_run} if config.mlflow_parent_run
                                else {})
    status = "FAILED"
    try:
        yield RunRecord(tensorboard, tracker)
        status = "FINISHED"
    except TrainingStoppedError:
        status = "KILLED"
        raise
    finally:
        if tensorboard is not None:
            tensorboard.close()
        summary = run_dir / "summary.json"
        write_json(summary, {"status": status, **vars(progress)})
        if tracker is not None:
            tracker.finish(status, [run_dir / "config.json", run_dir / "run.json", summary])
