"""The sweep's Optuna study, kept in the sweep directory, and what the sweep records of each trial.

The sweep directory (docs/SWEEPS.md lists it) holds ``sweep.json`` (the sweep file as read: a resumed sweep must
read the same), ``study.journal`` (Optuna's journal storage, which ``optuna-dashboard`` opens too: one appended
line per change, made for shared file systems), ``sweep.lock`` (held by the one sweep process working there) and
each trial's run directory.

The objective is the task's ``BestMetric``, signed so that higher is better (its value for ``max``, minus it for
``min``): the study always maximises, whatever the task, and the table shows the metric as the task gives it.
Which metric and direction it is, the trials say (their evaluations name it); the sweep needs to know no task.

Sampling happens here, once: a grid is enqueued in the file's order at the start; random and TPE draw a point
when a trial is about to start, with a sampler seeded by the sampler seed and the number of trials before it (so
a resumed sweep draws what an uninterrupted one would, never its first points again), and each point runs once
per seed (the other seeds enqueued behind it). A trial is an Optuna trial from its start to its end: RUNNING
while it runs (or when a stopped sweep left it interrupted), then COMPLETE, PRUNED or FAIL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
from optuna.trial import FrozenTrial, TrialState

from distqa.config import ConfigError
from distqa.sweeps.space import Pruning, Setting, SweepSpec

STUDY_NAME = "sweep"
JOURNAL_FILE = "study.journal"
SWEEP_FILE = "sweep.json"
LOCK_FILE = "sweep.lock"

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep's own log says what happens, in its words


def trial_dir_name(number: int) -> str:
    return f"trial-{number:03d}"


def storage(sweep_dir: Path) -> JournalStorage:
    """The study's journal in ``sweep_dir``. The open(2)-based lock works where symlinks do not (some network
    file systems); a lock left by a killed process is broken after its grace period."""
    path = str(sweep_dir / JOURNAL_FILE)
    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def pruner(pruning: Pruning) -> optuna.pruners.BasePruner:
    """Optuna's rule for ``pruning``: the median (or a percentile) of the completed trials at the same step."""
    if pruning.rule == "none":
        return optuna.pruners.NopPruner()
    percentile = 50.0 if pruning.rule == "median" else pruning.percentile
    return optuna.pruners.PercentilePruner(percentile, n_startup_trials=pruning.startup_trials,
                                           n_warmup_steps=pruning.min_step)


def create_study(sweep_dir: Path, spec: SweepSpec, record: Mapping[str, Any]) -> optuna.Study:
    """The sweep's study in ``sweep_dir``: created (a grid enqueued) on the first start, loaded on a resume after
    checking that ``sweep.json`` records the same sweep file. ``record`` (launcher, nodes, command) is saved
    beside the spec on the first start."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    saved_path = sweep_dir / SWEEP_FILE
    if saved_path.exists():
        saved = json.loads(saved_path.read_text())
        if saved["spec"] != json.loads(json.dumps(spec.to_dict())):
            raise ConfigError(f"{sweep_dir} holds a sweep of another sweep file or another version of it "
                              f"({saved['spec']['name']}); give this one its own --sweep-dir, or the same file as "
                              "before to resume that one.")
    else:
        saved_path.write_text(json.dumps({"spec": spec.to_dict(), **record}, indent=1) + "\n")
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage(sweep_dir), direction="maximize",
                                pruner=pruner(spec.pruning), load_if_exists=True)
    if spec.search == "grid" and not study.get_trials(deepcopy=False):
        runs = ((point, seed) for point in spec.grid_points() for seed in (spec.seeds or (None,)))
        for _, (point, seed) in zip(range(spec.trials), runs, strict=False):
            study.enqueue_trial(point, user_attrs={"seed": seed})
    return study


def load_study(sweep_dir: Path) -> optuna.Study:
    """The study of an existing sweep directory (a trial's rank 0, ``--show``), with the sweep's pruner."""
    saved = read_record(sweep_dir)
    return optuna.load_study(study_name=STUDY_NAME, storage=storage(sweep_dir),
                             pruner=pruner(Pruning(**saved["spec"]["prune"])))


def read_record(sweep_dir: Path) -> dict[str, Any]:
    path = sweep_dir / SWEEP_FILE
    if not path.is_file():
        raise ConfigError(f"{sweep_dir} is no sweep directory: it has no {SWEEP_FILE}.")
    return json.loads(path.read_text())


def sampler(spec: SweepSpec, drawn: int) -> optuna.samplers.BaseSampler:
    """The sampler that draws the point of the trial after ``drawn`` others: seeded by the sweep's sampler seed and
    ``drawn``, so that the same sweep file draws the same points, and a resumed sweep goes on with the stream where
    one built afresh on the seed alone would draw the first trials' points again. TPE reads the trials so far from
    the study; a grid's points are all enqueued, drawn by none."""
    seed = int(np.random.SeedSequence([spec.sampler_seed, drawn]).generate_state(1)[0])
    if spec.search == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def next_trial(study: optuna.Study, spec: SweepSpec) -> optuna.Trial | None:
    """The next trial to start, its settings drawn (or taken from the queue: a grid point, a seed's repeat); None
    when the budget is spent. Trials that a stopped sweep left RUNNING are not among them (:func:`interrupted`)."""
    trials = study.get_trials(deepcopy=False)
    waiting = any(t.state == TrialState.WAITING for t in trials)
    if not waiting and len(trials) >= spec.trials:
        return None
    study.sampler = sampler(spec, len(trials))
    trial = study.ask()
    for setting in spec.settings:
        suggest(trial, setting)
    seed = trial.user_attrs.get("seed", spec.seeds[0] if spec.seeds else None)
    trial.set_user_attr("seed", seed)
    if not waiting:  # a new point: its other seeds run next
        for repeat in spec.seeds[1:]:
            if len(study.get_trials(deepcopy=False)) < spec.trials:
                study.enqueue_trial(dict(trial.params), user_attrs={"seed": repeat})
    return trial


def suggest(trial: optuna.Trial, setting: Setting) -> Any:
    if not setting.is_range:
        return trial.suggest_categorical(setting.name, list(setting.values))
    if setting.integer:
        return trial.suggest_int(setting.name, int(setting.low), int(setting.high), log=setting.log)  # type: ignore[arg-type]
    return trial.suggest_float(setting.name, setting.low, setting.high, log=setting.log)  # type: ignore[arg-type]


def interrupted(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that a stopped sweep left running: resumed from their checkpoints before any new trial starts."""
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def signed(value: float, mode: str) -> float:
    """The objective of a metric ``value``: higher is better."""
    return value if mode == "max" else -value


@dataclass
class TrialRecord:
    """One trial as the table shows it."""

    number: int
    settings: dict[str, Any]
    seed: int | None
    state: str
    """done, pruned, failed, running, interrupted, waiting."""
    metric: str | None = None
    mode: str | None = None
    best: float | None = None
    """The task's best metric over the trial's evaluations, as the task gives it."""
    step: int = 0
    """Optimizer steps trained."""
    seconds: float = 0.0
    reason: str = ""
    launches: int = 0
    evaluations: dict[int, float] = field(default_factory=dict)
    """The metric at each evaluation step, as the task gives it."""

    @property
    def objective(self) -> float | None:
        return None if self.best is None or self.mode is None else signed(self.best, self.mode)


STATES = {TrialState.COMPLETE: "done", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
          TrialState.WAITING: "waiting", TrialState.RUNNING: "running"}


def records(study: optuna.Study, running_now: bool) -> list[TrialRecord]:
    """Every trial of the study; a RUNNING one is ``running`` while a sweep process works on the directory
    (``running_now``), ``interrupted`` otherwise."""
    found = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        state = STATES.get(t.state, t.state.name.lower())
        if state == "running" and not running_now:
            state = "interrupted"
        mode = attrs.get("mode")
        evaluations = {step: signed(v, mode) for step, v in t.intermediate_values.items()} if mode else {}
        found.append(TrialRecord(
            number=t.number, settings=dict(t.params) or dict(t.system_attrs.get("fixed_params", {})),
            seed=attrs.get("seed"), state=state, metric=attrs.get("metric"), mode=mode, best=attrs.get("best"),
            step=attrs.get("step", 0), seconds=attrs.get("seconds", 0.0), reason=attrs.get("reason", ""),
            launches=attrs.get("launches", 0), evaluations=evaluations))
    return found


def record_outcome(study: optuna.Study, number: int, summary: Mapping[str, Any] | None, failure: str) -> str:
    """End trial ``number`` in the study from its run's ``summary.json`` (None: it wrote none) or ``failure`` (a
    one-line reason; empty when the launcher succeeded). Returns its state in the table's words."""
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    progress = summary or {}
    for key, value in (("metric", progress.get("best_metric")), ("mode", progress.get("best_mode")),
                       ("best", progress.get("best_value")), ("step", progress.get("step", 0))):
        if value is not None:
            study._storage.set_trial_user_attr(trial_id, key, value)
    if not failure and (summary is None or summary.get("status") != "FINISHED"):
        failure = "the run wrote no summary of its end" if summary is None else f"the run ended {summary['status']}"
    best, mode = progress.get("best_value"), progress.get("best_mode")
    if not failure and (best is None or mode is None):
        failure = "the run made no evaluation: the task has no evaluator, or eval_every is past max_steps"
    if not failure and math.isnan(best):
        failure = f"the objective {progress.get('best_metric')} is NaN (a diverged run: a learning rate too high?)"
    if failure:
        study._storage.set_trial_user_attr(trial_id, "reason", failure)
        study.tell(number, state=TrialState.FAIL)
        return "failed"
    if progress.get("pruned_at"):
        study.tell(number, state=TrialState.PRUNED)
        return "pruned"
    study.tell(number, signed(best, mode))
    if study.metric_names is None:  # optuna-dashboard's name of the objective (the study holds the metric signed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the API's age, not our use
            study.set_metric_names([progress["best_metric"] if mode == "max" else f"-{progress['best_metric']}"])
    return "done"


def add_to_record(study: optuna.Study, number: int, **values: Any) -> None:
    """Set user attributes of trial ``number`` (``seconds`` and ``launches`` are added to what is there)."""
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    attrs = study._storage.get_trial(trial_id).user_attrs
    for key, value in values.items():
        if key in ("seconds", "launches"):
            value = attrs.get(key, 0) + value
        study._storage.set_trial_user_attr(trial_id, key, value)


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
