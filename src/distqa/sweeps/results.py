"""What a sweep shows: the table of its trials sorted by the objective, the best trial (its ``best.pt`` and the
command that trains its settings again), and a picture: a self-contained HTML page (inline SVG, no script, no
download) with the metric against each swept setting and each trial's evaluations over the steps.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distqa.sweeps.space import flag_value
from distqa.sweeps.study import TrialRecord, trial_dir_name

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


# --- the picture -------------------------------------------------------------------------------------------------

COLOURS = {"done": "#1f77b4", "pruned": "#ff7f0e", "running": "#2ca02c", "interrupted": "#9467bd",
           "failed": "#d62728", "waiting": "#7f7f7f"}
W, H, PAD = 420, 280, 48


def picture(records: Sequence[TrialRecord], names: Sequence[str], log_scale: Callable[[str], bool],
            title: str) -> str:
    """The HTML page: one scatter per swept setting (the best metric of each trial against its value; log axes
    where the setting's range is log, or its values span 100× and more) and the evaluations over the steps."""
    metric = next((r.metric for r in records if r.metric), None) or "objective"
    scored = [r for r in records if r.best is not None and not math.isnan(r.best)]
    plots = []
    for name in names:
        values = [r.settings.get(name) for r in scored]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values) and values
        log = bool(numeric) and min(values) > 0 and (log_scale(name) or max(values) >= 100 * min(values))
        points = [(r.settings.get(name), r.best, r) for r in scored]
        plots.append(_scatter(points, name, metric, bool(numeric), log))
    series = [(r, sorted(r.evaluations.items())) for r in records if r.evaluations]
    plots.append(_lines(series, metric))
    legend = " ".join(f'<span style="color:{c}">&#9679; {s}</span>' for s, c in COLOURS.items())
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
            f"<body style='font-family:sans-serif'><h2>{html.escape(title)}</h2><p>{legend}</p>"
            f"{''.join(plots)}</body></html>\n")


def _axis(values: Sequence[float], log: bool, lo_px: float, hi_px: float) -> Callable[[float], float]:
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    low, high = min(map(f, values)), max(map(f, values))
    if high == low:
        low, high = low - 1, high + 1
    return lambda v: lo_px + (f(v) - low) / (high - low) * (hi_px - lo_px)


def _frame(body: str, xlabel: str, ylabel: str, ticks: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' style='margin:8px'>"
            f"<rect x='{PAD}' y='8' width='{W - PAD - 8}' height='{H - PAD - 8}' fill='none' stroke='#999'/>{ticks}"
            f"<text x='{(W + PAD) / 2}' y='{H - 6}' text-anchor='middle' font-size='13'>{html.escape(xlabel)}</text>"
            f"<text x='12' y='{H / 2}' text-anchor='middle' font-size='13' transform='rotate(-90 12 {H / 2})'>"
            f"{html.escape(ylabel)}</text>{body}</svg>")


def _ticks(values: Sequence[Any], position: Callable[[Any], float], vertical: bool) -> str:
    out = []
    for v in dict.fromkeys(values):
        p = position(v)
        label = html.escape(f"{v:.3g}" if isinstance(v, float) else str(v))
        out.append(f"<text x='{p}' y='{H - PAD + 16}' text-anchor='middle' font-size='10'>{label}</text>" if vertical
                   else f"<text x='{PAD - 4}' y='{p + 3}' text-anchor='end' font-size='10'>{label}</text>")
    return "".join(out)


def _scatter(points: list[tuple[Any, float, TrialRecord]], name: str, metric: str, numeric: bool, log: bool) -> str:
    if not points:
        return _frame("", name, metric, "")
    xs = [p[0] for p in points]
    categories = list(dict.fromkeys(map(repr, xs)))
    x_of = _axis(xs, log, PAD + 16, W - 24) if numeric else \
        (lambda v: PAD + 16 + categories.index(repr(v)) * (W - PAD - 40) / max(1, len(categories) - 1))
    y_of = _axis([p[1] for p in points], False, H - PAD - 8, 20)
    dots = "".join(f"<circle cx='{x_of(x):.1f}' cy='{y_of(y):.1f}' r='5' fill='{COLOURS.get(r.state, '#000')}' "
                   f"fill-opacity='0.8'><title>{trial_dir_name(r.number)} {name}={x} seed={r.seed}: {metric} "
                   f"{y:.4g} ({r.state})</title></circle>" for x, y, r in points)
    ys = sorted({p[1] for p in points})
    ticks = _ticks(xs, x_of, True) + _ticks([ys[0], ys[-1]], y_of, False)
    return _frame(dots, f"{name}{' (log)' if log else ''}", metric, ticks)


def _lines(series: list[tuple[TrialRecord, list[tuple[int, float]]]], metric: str) -> str:
    values = [(s, v) for _, points in series for s, v in points if not math.isnan(v)]
    if not values:
        return _frame("", "step", metric, "")
    x_of = _axis([s for s, _ in values], False, PAD + 8, W - 16)
    y_of = _axis([v for _, v in values], False, H - PAD - 8, 20)
    body = ""
    for r, points in series:  # a line per trial, a dot per evaluation (a trial pruned at its first has only that)
        shown = [(x_of(s), y_of(v)) for s, v in points if not math.isnan(v)]
        colour, title = COLOURS.get(r.state, "#000"), f"<title>{trial_dir_name(r.number)} ({r.state})</title>"
        body += (f"<polyline points='{' '.join(f'{x:.1f},{y:.1f}' for x, y in shown)}' fill='none' "
                 f"stroke='{colour}' stroke-width='2'>{title}</polyline>")
        body += "".join(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='{colour}'>{title}</circle>" for x, y in shown)
    steps = sorted({s for s, _ in values})
    ys = sorted({v for _, v in values})
    ticks = _ticks([steps[0], steps[-1]], x_of, True) + _ticks([ys[0], ys[-1]], y_of, False)
    return _frame(body, "step", metric, ticks)


def write_picture(path: Path, records: Sequence[TrialRecord], names: Sequence[str],
                  log_scale: Callable[[str], bool], title: str) -> Path:
    path.write_text(picture(records, names, log_scale, title))
    return path
