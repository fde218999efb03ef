"""What a sweep shows: the table of its trials sorted by the objective, the best trial (its ``best.pt`` and the
command that trains its settings again), and a picture drawn with Optuna's own plots (its matplotlib module): a
self-contained HTML page of inline SVG (no script, no download) with the metric of the completed trials against
each swept setting and every trial's evaluations over the steps, the best trial and the metric's direction marked.
"""

from __future__ import annotations

import html
import io
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna
from matplotlib import pyplot as plt
from optuna.visualization import matplotlib as optuna_plots

from distqa.sweeps import study as studies
from distqa.sweeps.launch import Launcher
from distqa.sweeps.space import flag_value, flags
from distqa.sweeps.study import TrialRecord, trial_dir_name

BEST = "#d62728"
"""The best trial's colour in the picture."""
ORDER = {"done": 0, "pruned": 1, "running": 2, "interrupted": 3, "failed": 4, "waiting": 5}


def sorted_records(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """Best objective first (trials with a metric: done, pruned, running), then the others by state and number."""
    def key(r: TrialRecord) -> tuple[int, float, int]:
        objective = r.objective
        if objective is None or math.isnan(objective):
            return (1, ORDER.get(r.state, 9), r.number)
        return (0, -objective, r.number)
    return sorted(records, key=key)


def best_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The completed trial with the best objective (a pruned trial is never the best: it did not finish)."""
    done = [r for r in records if r.state == "done" and r.objective is not None and not math.isnan(r.objective)]
    return max(done, key=lambda r: (r.objective, -r.number), default=None)


def table(records: Sequence[TrialRecord], names: Sequence[str]) -> str:
    """The trials as a text table: trial, each swept setting, seed, the best metric, steps, state, time; a failed
    trial's reason under it."""
    metric = next((r.metric for r in records if r.metric), None) or "objective"
    header = ["trial", *names, "seed", metric, "step", "state", "time"]
    rows = []
    for r in sorted_records(records):
        best = "-" if r.best is None else f"{r.best:.4g}"
        rows.append([trial_dir_name(r.number), *(flag_value(r.settings[n]) if n in r.settings else "-" for n in names),
                     "-" if r.seed is None else str(r.seed), best, str(r.step), r.state, _duration(r.seconds)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    lines += [f"{trial_dir_name(r.number)} failed: {r.reason}" for r in sorted_records(records)
              if r.state == "failed" and r.reason]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def summary(sweep_dir: Path) -> str:
    """The table of the sweep in ``sweep_dir``, the best trial's ``best.pt`` and the command that reproduces it (what
    ``--show DIR`` prints, for a sweep running or done)."""
    saved = studies.read_record(sweep_dir)
    study = studies.load_study(sweep_dir)
    records = studies.records(study, running_now=studies.in_use(sweep_dir))
    names = list(saved["spec"]["space"])
    lines = [table(records, names)]
    counts = {state: sum(r.state == state for r in records) for state in ORDER}
    lines.append(f"{len(records)} of {saved['spec']['trials']} trials: " +
                 ", ".join(f"{n} {state}" for state, n in counts.items() if n))
    best = best_record(records)
    if best is not None:
        spec_args = [*(["--preset", saved["spec"]["preset"]] if saved["spec"]["preset"] else []),
                     *flags(saved["spec"]["fixed"]), *saved["trainer_args"], *flags(best.settings),
                     *([] if best.seed is None else ["--seed", str(best.seed)])]
        launcher = Launcher(saved["launcher"], saved["nodes"], saved["procs_per_node"], saved["launcher_args"])
        name = trial_dir_name(best.number)
        lines += [f"best: {name}, {best.metric} {best.best:.4g}: {sweep_dir / name / 'checkpoints' / 'best.pt'}",
                  f"reproduce: {launcher.reproduce([*spec_args, '--run-name', f'{name}-again'])}"]
    if (sweep_dir / "sweep.html").exists():
        lines.append(f"picture: {sweep_dir / 'sweep.html'}")
    return "\n".join(lines)


def picture(study: optuna.Study, records: Sequence[TrialRecord], title: str) -> str:
    """The HTML page: Optuna's slice plot (the metric of each completed trial against each swept setting, on a log
    axis where the setting's range is log) and its intermediate values plot (each trial's evaluations over the
    steps, pruned and running ones too), both in the metric as the task gives it (the study holds it signed), its
    direction in the axis's name and the best completed trial marked."""
    metric = next((r.metric for r in records if r.metric), None) or "objective"
    mode = next((r.mode for r in records if r.mode), "max")
    label = f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)"
    best = best_record(records)
    plt.switch_backend("agg")  # files only, never a window: the sweep may run where there is a display, or none
    figures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the plots' API, not our use
        warnings.filterwarnings("ignore", "Attempting to set identical")  # one value on an axis: matplotlib widens it
        if best is not None:  # the slice plot shows the completed trials: one of them is the best
            axes = optuna_plots.plot_slice(study, target=lambda t: studies.signed(t.value, mode), target_name=label)
            frozen = study.get_trials(deepcopy=False)[best.number]
            for ax, name in zip(getattr(axes, "flat", [axes]), sorted(frozen.params), strict=True):
                x = frozen.params[name]  # a list's values are the plot's categories, named as Optuna names them
                listed = isinstance(frozen.distributions[name], optuna.distributions.CategoricalDistribution)
                star = ax.scatter([repr(x) if listed else x], [best.best], marker="*", s=300, c=BEST, zorder=3,
                                  label=f"best: {trial_dir_name(best.number)}")
                ax.legend(handles=[star], loc="best")
            figures.append(ax.figure)
        if any(r.evaluations for r in records):
            ax = optuna_plots.plot_intermediate_values(study)
            ax.set(ylabel=label, title=f"{metric} at each evaluation")
            for line in ax.get_lines():
                number = int(line.get_label().removeprefix("Trial"))
                line.set_ydata([studies.signed(y, mode) for y in line.get_ydata()])
                if best is not None and number == best.number:
                    line.set(linewidth=3, color=BEST, label=f"{trial_dir_name(number)} (best)", zorder=3)
            ax.relim()
            ax.autoscale_view()
            ax.legend(bbox_to_anchor=(1.05, 1), loc="upper left", borderaxespad=0.0)
            figures.append(ax.figure)
    images = []
    for figure in figures:
        svg = io.StringIO()
        figure.savefig(svg, format="svg", bbox_inches="tight", metadata={"Date": None})
        plt.close(figure)
        images.append(svg.getvalue()[svg.getvalue().index("<svg"):])  # inline: no XML prologue, no DTD
    shown = f"best: {trial_dir_name(best.number)}, {metric} {best.best:.4g}" if best else "no completed trial yet"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif'><h2>{html.escape(title)}</h2><p>{html.escape(label)}; "
            f"{html.escape(shown)}</p>{''.join(images)}</body></html>\n")
