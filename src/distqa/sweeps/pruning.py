"""Rank 0 of a sweep's trial: each evaluation reported to the sweep's study, and the pruner asked whether the
trial falls behind the others at that step (``--sweep-trial DIR:N``, set by ``python -m distqa.sweep``).

The trainer broadcasts the answer so that every rank stops at the same step, through the early-stopping path:
a checkpoint, ``summary.json`` with ``pruned_at``, exit 0. The sweep reads that and ends the trial as pruned.
Asking never costs the run: a study that cannot be reached or a trial the sweep has already ended is one warning,
and the trial goes on unpruned.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from distqa.config import ConfigError
from distqa.distributed.runtime import broadcast_object
from distqa.tasks.base import BestMetric

log = logging.getLogger(__name__)


def parse_trial(value: str) -> tuple[Path, int]:
    """``DIR:N`` → (the sweep directory, the trial's number); a ConfigError naming the setting otherwise."""
    directory, _, number = value.rpartition(":")
    if not directory or not number.isdigit():
        raise ConfigError(f"sweep_trial: expected SWEEP_DIR:TRIAL_NUMBER (python -m distqa.sweep sets it), "
                          f"got {value!r}.")
    return Path(directory), int(number)


class TrialPruner:
    """The sweep's pruner for one trial: asked by rank 0 of its run, its answer broadcast to every rank."""

    def __init__(self, sweep_trial: str, asks: bool = True) -> None:
        self.sweep_dir, self.number = parse_trial(sweep_trial)
        self.asks = asks
        """Whether this process asks (rank 0); the others take its answer."""
        self._trial = None
        self._failed = False

    def prunes(self, step: int, value: float, best: BestMetric) -> bool:
        """Collective: rank 0 reports the evaluation at ``step`` (``value`` of the task's best metric) and asks
        whether the sweep's rule prunes the trial here; every rank returns its answer."""
        return bool(broadcast_object(self.ask(step, value, best.name, best.mode) if self.asks else False))

    def ask(self, step: int, value: float, metric: str, mode: str) -> bool:
        """Report the evaluation at ``step`` (the task's best metric ``metric``, better when ``mode``) and say
        whether the sweep's rule prunes the trial here (this process alone)."""
        if self._failed:
            return False
        try:
            trial = self._open()
            trial.set_user_attr("metric", metric)
            trial.set_user_attr("mode", mode)
            trial.report(value if mode == "max" else -value, step)  # the study maximises (distqa.sweeps.study)
            return bool(trial.should_prune()) or math.isnan(value)
        except Exception as err:  # the sweep's study is the sweep's: its failure never costs the trial
            self._failed = True
            log.warning("sweep trial %s: reporting to the sweep's study failed (%s: %s); the trial goes on and is "
                        "not pruned", self.number, type(err).__name__, (str(err).splitlines() or [""])[0][:200])
            return False

    def _open(self):
        if self._trial is None:
            # Here, not at the top: only a sweep's trial (rank 0) imports optuna (and the study module, which does).
            import optuna  # noqa: I001 (the comment above covers both)
            from distqa.sweeps.study import load_study

            study = load_study(self.sweep_dir)
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, self.number)
            self._trial = optuna.Trial(study, trial_id)
        return self._trial
