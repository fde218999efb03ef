"""Run a hyperparameter sweep whose trials are ordinary multi-node runs, and show its results (docs/SWEEPS.md).

A sweep file (``configs/sweeps/NAME.toml``) says what to vary (each setting a list or a range, plus seeds), how
to search (grid, random, TPE) and how many trials to run; every trial is then a normal run with its own run
directory, ``best.pt``, TensorBoard and MLflow run, started through the same launcher as a run by hand::

    python -m distqa.sweep demo                                  # 2 emulated nodes per trial, one at a time
    python -m distqa.sweep NAME --launcher platform --nodes 4 --parallel 2 -- --data-file /data/...
    python -m distqa.sweep NAME --launcher slurm --nodes 2 --launcher-args "--gpus-per-node 8"
    python -m distqa.sweep --show results/sweeps/demo             # the table of a sweep, running or done

The settings of a trial are drawn here, once, and reach every rank of every node as ordinary flags (the
preflight's config hash then shows that all ranks agree). The objective is the task's best metric, the one that
keeps ``best.pt``; after each evaluation a trial asks the sweep's pruner whether it falls behind the others at
that step, and stops there as "pruned" when it does. Ctrl-C or SIGTERM stops the running trials gracefully (a
checkpoint each; exit 75); the same command again resumes them from their checkpoints, never runs a finished
trial again and keeps the trial count. A trial that fails is recorded with its reason and the sweep goes on.
At the end (and after every trial): the table sorted by the objective (``results.txt``), the picture
(``sweep.html``), the best trial's ``best.pt`` and the command that trains its settings again.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from dotenv import load_dotenv

from distqa.config import ConfigError
from distqa.config.errors import report_failure
from distqa.config.sources import SettingSources, dotenv_file, load_config
from distqa.distributed.stop import STOPPED_EXIT_CODE
from distqa.sweeps import results
from distqa.sweeps import study as studies
from distqa.sweeps.launch import LAUNCHERS, Launcher, Running, ended_process, failure_reason
from distqa.sweeps.space import SweepSpec, check_trial_configs, flags, read_sweep, trial_args
from distqa.tasks import task_class

log = logging.getLogger("distqa.sweep")
LOCK_FILE = "sweep.lock"
MAX_LAUNCHES = 5
"""A trial stopped from outside (a preempted Slurm job) is resumed at most this often before it counts as failed."""


def main(argv: Sequence[str] | None = None) -> int:
    load_dotenv(dotenv_file(), override=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sweep: %(message)s", datefmt="%H:%M:%S")
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.show:
            print(summary(Path(args.show).resolve()))
            return 0
        return run_sweep(args)
    except ConfigError as err:
        return report_failure(f"distqa.sweep: {err}", 2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    trainer = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m distqa.sweep", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("sweep", nargs="?", help="configs/sweeps/NAME.toml by NAME, or a path to a .toml")
    parser.add_argument("--show", metavar="DIR", help="print the table of the sweep in DIR (running or done)")
    parser.add_argument("--sweep-dir", help="where the study and the trials' run directories go "
                        "(default: results/sweeps/NAME); on shared storage that every trial's node sees")
    parser.add_argument("--trial-sweep-dir", help="the sweep directory as the trials' nodes see it, when their "
                        "path differs (a platform job's /project/results/...; default: --sweep-dir)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local", help="how trials start (default local)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of each trial (default 2)")
    parser.add_argument("--procs-per-node", type=int, default=1, help="processes per node (GPUs; default 1)")
    parser.add_argument("--parallel", type=int, default=1, help="trials running at once (default 1)")
    parser.add_argument("--launcher-args", default="", help="the launcher's own options for every trial, as one "
                        "string (platform: '--preset gpu-large'; slurm: sbatch options)")
    args = parser.parse_args(own)
    args.trainer_args = trainer
    if not args.show and not args.sweep:
        parser.error("name a sweep file, or --show DIR")
    for name in ("nodes", "procs_per_node", "parallel"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def run_sweep(args: argparse.Namespace) -> int:
    """The story of a sweep: read and check the space, take the directory, run the trials, show the results."""
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
    with exclusive(sweep_dir):
        record = {"launcher": args.launcher, "nodes": args.nodes, "procs_per_node": args.procs_per_node,
                  "launcher_args": launcher.extra, "trainer_args": args.trainer_args,
                  "command": shlex.join(["python", "-m", "distqa.sweep", *sys.argv[1:]])}
        study = studies.create_study(sweep_dir, spec, record)
        trial_dir = Path(args.trial_sweep_dir or sweep_dir)
        parent = mlflow_parent_run(study, spec, args.trainer_args, environ)
        sweep = Sweep(spec, launcher, study, sweep_dir, trial_dir, args.trainer_args, args.parallel, parent)
        stopped = sweep.run()
        print(summary(sweep_dir), flush=True)
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
        logs = {s.name for s in self.spec.settings if s.log}
        results.write_picture(self.sweep_dir / "sweep.html", records, names, lambda n: n in logs,
                              f"sweep {self.spec.name}: {self.sweep_dir}")

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


@contextlib.contextmanager
def exclusive(sweep_dir: Path) -> Iterator[IO[str]]:
    """Hold ``sweep.lock`` in ``sweep_dir`` (flock) for the block; a ConfigError when another sweep process has it."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with (sweep_dir / LOCK_FILE).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ConfigError(f"{sweep_dir} is in use by another sweep process (pid {holder}); wait for it to end, "
                              f"or stop it (Ctrl-C) and run this again to resume.") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield lock


def in_use(sweep_dir: Path) -> bool:
    """Whether a sweep process holds ``sweep_dir``'s lock now."""
    path = sweep_dir / LOCK_FILE
    if not path.exists():
        return False
    with path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def summary(sweep_dir: Path) -> str:
    """The table of the sweep in ``sweep_dir``, the best trial's ``best.pt`` and the command that reproduces it (what
    ``--show DIR`` prints, for a sweep running or done)."""
    saved = studies.read_record(sweep_dir)
    study = studies.load_study(sweep_dir)
    records = studies.records(study, running_now=in_use(sweep_dir))
    names = list(saved["spec"]["space"])
    lines = [results.table(records, names)]
    counts = {state: sum(r.state == state for r in records) for state in results.ORDER}
    lines.append(f"{len(records)} of {saved['spec']['trials']} trials: " +
                 ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    best = results.best_record(records)
    if best is not None:
        spec_args = [*(["--preset", saved["spec"]["preset"]] if saved["spec"]["preset"] else []),
                     *flags(saved["spec"]["fixed"]), *saved["trainer_args"], *flags(best.settings),
                     *([] if best.seed is None else ["--seed", str(best.seed)])]
        launcher = Launcher(saved["launcher"], saved["nodes"], saved["procs_per_node"], saved["launcher_args"])
        name = studies.trial_dir_name(best.number)
        lines += [f"best: {name}, {best.metric} {best.best:.4g}: {sweep_dir / name / 'checkpoints' / 'best.pt'}",
                  f"reproduce: {launcher.reproduce([*spec_args, '--run-name', f'{name}-again'])}"]
    if (sweep_dir / "sweep.html").exists():
        lines.append(f"picture: {sweep_dir / 'sweep.html'}")
    return "\n".join(lines)


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


if __name__ == "__main__":
    sys.exit(main())
