"""A sweep's run: the space read and checked against the trainer's own rules, the sweep directory taken, the
trials started through their launcher up to ``parallel`` at once, their ends recorded, stops passed on
gracefully and the results written after every trial (``python -m distqa.sweep``, docs/SWEEPS.md)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from distqa.config import ConfigError
from distqa.config.sources import SettingSources, load_config
from distqa.distributed.stop import STOPPED_EXIT_CODE
from distqa.sweeps import results
from distqa.sweeps import study as studies
from distqa.sweeps.launch import Launcher, Running, ended_process, failure_reason, slurm_job_state
from distqa.sweeps.space import SweepSpec, check_trial_configs, read_sweep, trial_args
from distqa.tasks import task_class

log = logging.getLogger("distqa.sweep")
MAX_LAUNCHES = 5
"""A trial stopped from outside (a preempted Slurm job) is resumed at most this often before it counts as failed."""


def run_sweep(args: argparse.Namespace, command: str) -> int:
    """The story of a sweep: read and check the space, take the directory, run the trials, show the results
    (``args``: the command line's, ``command`` as typed, recorded in sweep.json). Its exit status: 75 when a stop
    signal ended it, 0 otherwise."""
    spec = read_sweep(args.sweep, lambda preset, task: settings_class(preset, task, args.trainer_args))
    launcher = Launcher(args.launcher, args.nodes, args.procs_per_node, shlex.split(args.launcher_args),
                        run_id_prefix=spec.name)
    environ = {**os.environ, "WORLD_SIZE": str(launcher.world_size)}
    # Every corner of the space through the trainer's own checks, for the world size the trials run on (a notice
    # of the settings' loading said once, not once per corner).
    with said_once(logging.getLogger("distqa.config.sources")):
        check_trial_configs(spec, lambda flags: load_config(flags, environ, prog="distqa.sweep (a trial)",
                                                            check_data_paths=args.launcher == "local"),
                            args.trainer_args)
    sweep_dir = Path(args.sweep_dir or Path("results") / "sweeps" / spec.name).resolve()
    with studies.exclusive(sweep_dir):
        record = {"launcher": args.launcher, "nodes": args.nodes, "procs_per_node": args.procs_per_node,
                  "launcher_args": launcher.extra, "trainer_args": args.trainer_args, "command": command}
        study = studies.create_study(sweep_dir, spec, record)
        trial_dir = Path(args.trial_sweep_dir or sweep_dir)
        parent = mlflow_parent_run(study, spec, args.trainer_args, environ)
        sweep = Sweep(spec, launcher, study, sweep_dir, trial_dir, args.trainer_args, args.parallel, parent)
        stopped = sweep.run()
        print(results.summary(sweep_dir), flush=True)
    return STOPPED_EXIT_CODE if stopped else 0


class Sweep:
    """Runs the trials of a study, up to ``parallel`` at once, until the budget is spent or a stop signal."""

    def __init__(self, spec: SweepSpec, launcher: Launcher, study: Any, sweep_dir: Path, trial_dir: Path,
                 extra_args: list[str], parallel: int, parent: str | None) -> None:
        self.spec, self.launcher, self.study, self.sweep_dir = spec, launcher, study, sweep_dir
        self.trial_dir, self.extra_args, self.parallel, self.parent = trial_dir, extra_args, parallel, parent
        self.running: list[Running] = []
        self.stopping = False
        self.resume_queue = [t.number for t in studies.interrupted(study)]
        """Trials a stopped sweep left running: resumed first, from their checkpoints."""
        for trial in studies.interrupted(study):
            refuse_if_still_running(trial.number, trial.user_attrs.get("launcher", ""))
        self.offsets: dict[int, int] = {}
        """Where each running trial's launch begins in its launcher.log (the reason of a failure is in its part)."""

    def run(self) -> bool:
        """True when a stop signal ended the sweep before its budget (the running trials checkpointed)."""
        if self.resume_queue:
            log.info("resuming %s, interrupted by a stop, from their checkpoints",
                     ", ".join(map(studies.trial_dir_name, self.resume_queue)))
        with self.stop_signals():
            while True:
                while not self.stopping and len(self.running) < self.parallel and self.start_next():
                    pass
                if not self.running:
                    break
                ended = ended_process(self.running, 1.0)
                if ended is not None:
                    self.finish(ended)
        self.write_results()
        return self.stopping

    def start_next(self) -> bool:
        if self.resume_queue:
            number = self.resume_queue.pop(0)
            frozen = self.study.get_trials(deepcopy=False)[number]
            settings, seed = dict(frozen.params), frozen.user_attrs.get("seed")
        else:
            trial = studies.next_trial(self.study, self.spec)
            if trial is None:
                return False
            number, settings, seed = trial.number, dict(trial.params), trial.user_attrs.get("seed")
        name = studies.trial_dir_name(number)
        trainer_flags = [*trial_args(self.spec, settings, seed, self.extra_args), "--run-name", name,
                         "--output-dir", str(self.trial_dir), "--sweep-trial", f"{self.trial_dir}:{number}",
                         *(["--mlflow-parent-run", self.parent] if self.parent else [])]
        log_path = self.sweep_dir / name / "launcher.log"
        self.offsets[number] = log_path.stat().st_size if log_path.exists() else 0
        shown = ", ".join(f"{k}={v}" for k, v in settings.items()) + ("" if seed is None else f", seed={seed}")
        log.info("%s: %s (%s)", name, shown, "resumed" if (self.sweep_dir / name / "checkpoints").is_dir()
                 else "started")
        self.running.append(self.launcher.start(number, trainer_flags, log_path))
        studies.add_to_record(self.study, number, launcher=f"{socket.gethostname()}:{self.running[-1].process.pid}")
        if self.stopping:  # a stop signal came while it was starting: the handler did not see it yet
            self.launcher.stop(self.running[-1])
        return True

    def finish(self, ended: Running) -> None:
        """Record how the trial's launcher ended: done, pruned, failed, or stopped (resumable)."""
        self.running.remove(ended)
        ended.log.close()
        code = ended.process.returncode
        studies.add_to_record(self.study, ended.number, seconds=time.monotonic() - ended.started, launches=1)
        name = studies.trial_dir_name(ended.number)
        outcome = self.launcher.outcome(code, ended.stop_asked)
        if outcome == "stopped" and self.stopping:
            log.info("%s stopped with a checkpoint; the same command resumes it", name)
            return
        launches = self.study.get_trials(deepcopy=False)[ended.number].user_attrs.get("launches", 0)
        if outcome == "stopped" and launches < MAX_LAUNCHES:  # stopped from outside (preemption): resumed at once
            log.info("%s was stopped from outside with a checkpoint (exit %d): resuming it", name, code)
            self.resume_queue.insert(0, ended.number)
            return
        run_summary = read_json(self.sweep_dir / name / "summary.json")
        text = ended.log_path.read_text(errors="replace")[self.offsets.get(ended.number, 0):]
        reason = "" if outcome == "ended" else failure_reason(text, code)
        if not reason and self.launcher.name == "slurm" and (run_summary or {}).get("status") != "FINISHED":
            # sbatch --wait exits 0 for a job cancelled while its tasks launched or stopped (docs/SLURM.md): Slurm's
            # own word on the job, from sacct, says what ended it
            job_state = slurm_job_state([line.strip() for line in text.splitlines()])
            reason = f"{job_state} (exit {code})" if job_state else ""
        state = studies.record_outcome(self.study, ended.number, run_summary, reason)
        record = next(r for r in studies.records(self.study, True) if r.number == ended.number)
        metric = f"{record.metric} {record.best:.4g}" if record.best is not None else "no metric"
        step = f" at step {run_summary.get('pruned_at')}" if state == "pruned" and run_summary else ""
        log.info("%s %s%s: %s after %d steps%s", name, state, step, metric, record.step,
                 f"; {reason}" if reason else "")
        self.write_results()

    def write_results(self) -> None:
        records = studies.records(self.study, running_now=not self.stopping)
        names = [s.name for s in self.spec.settings]
        (self.sweep_dir / "results.txt").write_text(results.table(records, names) + "\n")
        page = results.picture(self.study, records, f"sweep {self.spec.name}: {self.sweep_dir}")
        (self.sweep_dir / "sweep.html").write_text(page)

    @contextlib.contextmanager
    def stop_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM: no new trial starts, and each running one is asked to stop once (a checkpoint of the
        step it reaches); a second signal asks again, which the local launcher takes as a stop at once."""
        def on_signal(signum: int, _frame: object) -> None:
            if not self.stopping:
                log.info("%s: stopping the running trials with a checkpoint each; run the same command again to "
                         "resume", signal.Signals(signum).name)
            again = self.stopping
            self.stopping = True
            for trial in self.running:
                if again and self.launcher.name == "local" and trial.process.poll() is None:
                    trial.process.send_signal(signal.SIGTERM)
                else:
                    self.launcher.stop(trial)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def refuse_if_still_running(number: int, launcher: str) -> None:
    """A ConfigError when trial ``number``'s launcher (``host:pid``, recorded when it started) still runs here: a
    sweep killed outright (SIGKILL) leaves its trials' launchers running, and a second launcher of the same trial
    would write the same run directory."""
    host, _, pid = launcher.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if studies.trial_dir_name(number).encode() in command or f"-t{number}\0".encode() in command:
        raise ConfigError(f"{studies.trial_dir_name(number)}'s launcher (pid {pid}) from an earlier sweep process "
                          f"still runs; stop it (kill -TERM {pid}: a checkpoint, then exit) or wait for it to end, "
                          "then run this again to resume.")


@contextlib.contextmanager
def said_once(logger: logging.Logger) -> Iterator[None]:
    """Within the block, ``logger`` drops a message it has already logged."""
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        new = message not in seen
        seen.add(message)
        return new

    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


def settings_class(preset: str | None, task: str | None, extra: Sequence[str]) -> type:
    """The settings class of the trials' task, chosen as the trainer chooses it (flags, environment, preset)."""
    argv = [*(["--preset", preset] if preset else []), *(["--task", task] if task else []), *extra]
    return task_class(SettingSources.read(argv, os.environ, None).task).config_class


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def mlflow_parent_run(study: Any, spec: SweepSpec, extra: Sequence[str], environ: dict[str, str]) -> str | None:
    """With ``--tracker mlflow`` in the trials' settings: the sweep's own MLflow run, parent of every trial's (made
    on the first start, found again on a resume); None otherwise."""
    config = load_config(trial_args(spec, {}, None, extra), environ, prog="distqa.sweep", check_data_paths=False)
    if config.tracker != "mlflow":
        return None
    if "mlflow_parent_run" in study.user_attrs:
        return str(study.user_attrs["mlflow_parent_run"])
    # Here, not at the top: the MLflow client is imported only by sweeps that track.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # there: load_config checked it
    found = client.get_experiment_by_name(config.mlflow_experiment)
    experiment = found.experiment_id if found else client.create_experiment(config.mlflow_experiment)
    run_id = client.create_run(experiment, run_name=f"sweep {spec.name}").info.run_id
    study.set_user_attr("mlflow_parent_run", run_id)
    return run_id


