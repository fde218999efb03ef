"""The sweep file: what a sweep varies, how it searches, how many trials it may run, and when it prunes.

``configs/sweeps/NAME.toml`` (or any path to a ``.toml``; docs/SWEEPS.md shows every key). Everything is checked
when the file is read, before any trial starts, each error one line naming the file and the key: an unknown setting
(against the task's settings class), an empty list or range, a log range over zero, a grid larger than its budget
allows. What needs the whole config (a world size above the global batch) is checked by
:func:`check_trial_configs` with the trainer's own rules. No torch here.
"""

from __future__ import annotations

import itertools
import math
import tomllib
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from distqa.config import REPO_ROOT, Config, ConfigError, fields_of
from distqa.config.values import base_type, coerce, types_of

SWEEPS_DIR = REPO_ROOT / "configs" / "sweeps"
SEARCHES = ("grid", "random", "tpe")
RULES = ("median", "percentile", "none")
NOT_SWEPT = {"preset": "set `preset` at the top of the file", "task": "a sweep trains one task",
             "seed": "list the seeds in `seeds`", "run_name": "the sweep names each trial's run directory",
             "output_dir": "the sweep directory holds the trials (--sweep-dir)", "resume": "the sweep resumes trials",
             "sweep_trial": "the sweep sets it", "mlflow_parent_run": "the sweep sets it"}
"""Settings a sweep sets itself or that no search varies, with the reason given when a file names one."""


@dataclass(frozen=True)
class Setting:
    """One swept setting: a list of values, or a range [low, high] (linear or log; ``points`` values in a grid)."""

    name: str
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    points: int = 0
    integer: bool = False
    """A range of an int setting: sampled as integers."""

    @property
    def is_range(self) -> bool:
        return self.low is not None

    def grid(self) -> tuple[Any, ...]:
        """The values a grid search takes: the list, or ``points`` values spread over the range (log or linear)."""
        if not self.is_range:
            return self.values
        assert self.low is not None and self.high is not None
        if self.log:
            step = (math.log(self.high) - math.log(self.low)) / (self.points - 1)
            spread = [math.exp(math.log(self.low) + i * step) for i in range(self.points)]
        else:
            spread = [self.low + i * (self.high - self.low) / (self.points - 1) for i in range(self.points)]
        spread[-1] = self.high  # exactly the bound, not the sum's rounding
        values = [round(v) if self.integer else float(f"{v:.6g}") for v in spread]
        return tuple(dict.fromkeys(values))

    def corners(self) -> tuple[Any, ...]:
        """The values a check of the whole config tries: every value of a list, both ends of a range."""
        if not self.is_range:
            return self.values
        return (int(self.low), int(self.high)) if self.integer else (self.low, self.high)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Pruning:
    rule: Literal["median", "percentile", "none"] = "median"
    startup_trials: int = 2
    """Completed trials before any trial is pruned (the rule needs trials to compare with)."""
    min_step: int = 0
    """No trial is pruned at an evaluation before this optimizer step."""
    percentile: float = 25.0
    """``percentile``: a trial is pruned below this percentile of the others at the same step."""


@dataclass(frozen=True)
class SweepSpec:
    """A sweep file, read and checked (:func:`read_sweep`)."""

    path: Path
    name: str
    search: Literal["grid", "random", "tpe"]
    trials: int
    seeds: tuple[int, ...]
    """Empty: one run per point with the trials' own seed setting."""
    settings: tuple[Setting, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    preset: str | None = None
    sampler_seed: int = 0
    pruning: Pruning = Pruning()

    def grid_points(self) -> Iterator[dict[str, Any]]:
        """Every point of the grid, in the file's order (the first setting varies slowest)."""
        names = [s.name for s in self.settings]
        for values in itertools.product(*(s.grid() for s in self.settings)):
            yield dict(zip(names, values, strict=True))

    def grid_size(self) -> int:
        return math.prod(len(s.grid()) for s in self.settings)

    def base_args(self) -> list[str]:
        """The flags every trial starts with: the preset, then the fixed settings."""
        preset = ["--preset", self.preset] if self.preset else []
        return [*preset, *flags(self.fixed)]

    def to_dict(self) -> dict[str, Any]:
        """What the sweep directory records (sweep.json): a resumed sweep must read the same."""
        return {"name": self.name, "search": self.search, "trials": self.trials, "seeds": list(self.seeds),
                "preset": self.preset, "fixed": dict(self.fixed), "sampler_seed": self.sampler_seed,
                "space": {s.name: {"values": list(s.values), "low": s.low, "high": s.high, "log": s.log,
                                   "points": s.points} for s in self.settings},
                "prune": vars(self.pruning)}


def sweep_path(name: str) -> Path:
    """``NAME`` → ``configs/sweeps/NAME.toml``; a path ending in ``.toml`` as it is."""
    return Path(name) if name.endswith(".toml") else SWEEPS_DIR / f"{name}.toml"


def read_sweep(name: str, settings_of: Callable[[str | None, str | None], type[Config]]) -> SweepSpec:
    """The sweep file ``name``, checked; ``settings_of(preset, task)`` is the settings class of the trials' task
    (what ``--task`` or the preset names), whose fields are what may be swept. A ConfigError naming the file and
    the key otherwise."""
    path = sweep_path(name)
    if not path.is_file():
        known = sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
        raise ConfigError(f"sweep {name!r}: {path} does not exist; choose one of {known} or a path to a .toml file.")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"sweep {path}: not valid TOML ({err}).") from None
    where = f"sweep {path}"
    unknown = set(raw) - {"preset", "search", "trials", "seeds", "fixed", "space", "prune", "sampler_seed"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; the keys are preset, search, trials, seeds, "
                          "sampler_seed and the tables [fixed], [space], [prune] (docs/SWEEPS.md).")
    preset = _typed(raw, "preset", str, None, where)
    fixed = _table(raw, "fixed", where)
    config_class = settings_of(preset, fixed.get("task"))
    space = _table(raw, "space", where)
    if not space:
        raise ConfigError(f"{where}: [space] names no setting; add one, such as lr = [1e-4, 3e-4].")
    settings = tuple(_setting(name, value, config_class, where) for name, value in space.items())
    for name, value in fixed.items():
        _check_name(name, config_class, f"{where}: [fixed]", allowed=("task",))
        coerce(name, value, f"{where} [fixed]", config_class) if name != "task" else None
    search = _typed(raw, "search", str, "grid", where)
    if search not in SEARCHES:
        raise ConfigError(f"{where}: search {search!r} is none of {list(SEARCHES)}.")
    seeds = raw.get("seeds", [])
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)) \
            and "seeds" in raw:
        raise ConfigError(f"{where}: seeds must be a non-empty list of integers, such as seeds = [1, 2, 3].")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: seeds {seeds} repeats a seed; list each once.")
    spec = SweepSpec(path=path, name=path.stem, search=search, trials=0, seeds=tuple(seeds), settings=settings,
                     fixed=fixed, preset=preset, sampler_seed=_typed(raw, "sampler_seed", int, 0, where),
                     pruning=_pruning(_table(raw, "prune", where), where))
    if spec.sampler_seed < 0:
        raise ConfigError(f"{where}: sampler_seed must be 0 or more, got {spec.sampler_seed}.")
    runs_per_point = max(1, len(spec.seeds))
    if search == "grid":
        for s in settings:
            if s.is_range and s.points < 2:
                raise ConfigError(f"{where}: [space] {s.name}: a grid needs `points` (2 or more) values of the range "
                                  f"{s.low}..{s.high}, such as {{ low = {s.low}, high = {s.high}, points = 3 }}.")
        whole = spec.grid_size() * runs_per_point
        trials = _typed(raw, "trials", int, whole, where)
        if not 1 <= trials <= whole:
            raise ConfigError(f"{where}: trials = {trials}, but the grid has {whole} trials ({spec.grid_size()} "
                              f"points × {runs_per_point} seeds); use 1..{whole}, or leave trials out for all of them.")
    else:
        if "trials" not in raw:
            raise ConfigError(f"{where}: search {search!r} needs a budget: trials = N.")
        trials = _typed(raw, "trials", int, 0, where)
        if trials < 1:
            raise ConfigError(f"{where}: trials must be at least 1, got {trials}.")
    return SweepSpec(**{**vars(spec), "trials": trials})


def check_trial_configs(spec: SweepSpec, check: Callable[[list[str]], Any], extra_args: Sequence[str] = ()) -> None:
    """Build the config of every corner of the space (each list value, both ends of each range, every seed) with
    ``check`` (the trainer's own loading, for the world size the trials run on) before any trial starts: a global
    batch smaller than the world size, or a value the settings refuse, is a ConfigError naming the point. Past
    4096 corners, each setting's corners are tried with the others at their first value."""
    corners = [s.corners() for s in spec.settings]
    if math.prod(len(c) for c in corners) <= 4096:
        points: Iterator[tuple[Any, ...]] = itertools.product(*corners)
    else:
        first = tuple(c[0] for c in corners)
        points = ((*first[:i], value, *first[i + 1:]) for i, c in enumerate(corners) for value in c)
    for point in points:
        settings = dict(zip((s.name for s in spec.settings), point, strict=True))
        for seed in spec.seeds or (None,):
            args = trial_args(spec, settings, seed, extra_args)
            try:
                check(args)
            except ConfigError as err:
                shown = ", ".join(f"{k}={v}" for k, v in settings.items())
                raise ConfigError(f"sweep {spec.path}: the trial with {shown} is refused: {err}") from None


def trial_args(spec: SweepSpec, settings: Mapping[str, Any], seed: int | None, extra_args: Sequence[str] = ()
               ) -> list[str]:
    """A trial's trainer flags: the sweep's base, the command line's extra flags, its settings and its seed."""
    return [*spec.base_args(), *extra_args, *flags(settings), *([] if seed is None else ["--seed", str(seed)])]


def flags(settings: Mapping[str, Any]) -> list[str]:
    """``{"lr": 3e-05}`` → ``["--lr", "3e-05"]``: each value written so that the flag parses back to it exactly."""
    return [part for name, value in settings.items() for part in (f"--{name.replace('_', '-')}", flag_value(value))]


def flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


# --- reading -----------------------------------------------------------------------------------------------------

def _setting(name: str, value: Any, config_class: type[Config], where: str) -> Setting:
    _check_name(name, config_class, f"{where}: [space]")
    place = f"{where}: [space] {name}"
    kind, _ = base_type(types_of(config_class)[name])
    if isinstance(value, list):
        if not value:
            raise ConfigError(f"{place} is an empty list; give it at least one value.")
        values = tuple(coerce(name, v, place, config_class) for v in value)
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"{place} lists a value twice: {list(value)}.")
        return Setting(name, values=values)
    if not isinstance(value, dict):
        raise ConfigError(f"{place}: expected a list of values or a range {{ low = .., high = .. }}, got {value!r}.")
    extra = set(value) - {"low", "high", "log", "points"}
    if extra or not {"low", "high"} <= set(value):
        raise ConfigError(f"{place}: a range has low, high and optionally log = true and points = N "
                          f"(got {sorted(value)}).")
    if kind not in (int, float):
        raise ConfigError(f"{place}: a range needs a numeric setting; {name} is {typing.get_args(kind) or kind}: "
                          "give a list of values.")
    low, high = (coerce(name, value[k], place, config_class) for k in ("low", "high"))
    log, points = value.get("log", False), value.get("points", 0)
    if not isinstance(log, bool) or not isinstance(points, int) or isinstance(points, bool) or points < 0:
        raise ConfigError(f"{place}: log must be true or false and points a whole number >= 2.")
    if not low < high:
        raise ConfigError(f"{place}: the range {low}..{high} is empty; low must be below high.")
    if log and low <= 0:
        raise ConfigError(f"{place}: a log range must lie above zero, got {low}..{high}; use a linear range or a "
                          "positive low.")
    return Setting(name, low=low, high=high, log=log, points=points, integer=kind is int)


def _check_name(name: str, config_class: type[Config], place: str, allowed: tuple[str, ...] = ()) -> None:
    if name in NOT_SWEPT and name not in allowed:
        raise ConfigError(f"{place}: {name} cannot be set here: {NOT_SWEPT[name]}.")
    if name not in fields_of(config_class) and name not in allowed:
        import difflib  # only on this error

        close = difflib.get_close_matches(name, fields_of(config_class), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{place}: unknown setting {name!r} for task settings {config_class.__name__}; {hint}"
                          "`python -m distqa.train --task TASK --help` lists them.")


def _pruning(raw: Mapping[str, Any], where: str) -> Pruning:
    unknown = set(raw) - {"rule", "startup_trials", "min_step", "percentile"}
    if unknown:
        raise ConfigError(f"{where}: [prune] has no key {sorted(unknown)[0]!r}; its keys are rule, startup_trials, "
                          "min_step, percentile.")
    rule = _typed(raw, "rule", str, "median", f"{where}: [prune]")
    if rule not in RULES:
        raise ConfigError(f"{where}: [prune] rule {rule!r} is none of {list(RULES)}.")
    pruning = Pruning(rule=rule, startup_trials=_typed(raw, "startup_trials", int, 2, f"{where}: [prune]"),
                      min_step=_typed(raw, "min_step", int, 0, f"{where}: [prune]"),
                      percentile=float(_typed(raw, "percentile", (int, float), 25.0, f"{where}: [prune]")))
    if pruning.startup_trials < 1 or pruning.min_step < 0 or not 0 < pruning.percentile < 100:
        raise ConfigError(f"{where}: [prune] needs startup_trials >= 1, min_step >= 0 and 0 < percentile < 100.")
    return pruning


def _table(raw: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a table ([{key}]), got {value!r}.")
    return value


def _typed(raw: Mapping[str, Any], key: str, kind: Any, default: Any, where: str) -> Any:
    value = raw.get(key, default)
    if value is not default and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ConfigError(f"{where}: {key} = {value!r} is not of the right type "
                          f"({getattr(kind, '__name__', 'a number')}).")
    return value
