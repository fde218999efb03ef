"""Where the settings of a run come from, and which of them each entry point accepts.

Precedence, lowest to highest::

    built-in defaults  <  preset file (configs/NAME.toml)  <  .env file and environment
    variables (DISTQA_<FIELD>)  <  command-line flags (--field-name VALUE)

The preset is picked with ``--preset NAME`` (or ``DISTQA_PRESET``); ``tiny-cpu`` is the default and
``--preset none`` uses the built-in defaults alone. The task is picked next, by the same precedence
(``--task``, ``DISTQA_TASK``, the preset's ``task``), and its settings class (``Task.config_class``)
decides which settings exist: ``python -m distqa.train --task NAME --help`` shows that task's.
A preset applies only to the tasks it names (:mod:`distqa.config.presets`): the default one is left out of another
task's run (a fork's gets the built-in defaults), and one given for another task is refused.

A preset and the environment describe a whole run, so they may set any setting of the task; a setting
of another registered task there is ignored (a ``.env`` may serve several tasks), while a flag of another
task is refused with the fix. The command line of each entry point accepts (and ``--help`` shows) only
the sections it uses (:mod:`distqa.config.flags`). ``predict`` and ``evaluate`` take the checkpoint's settings
(:func:`saved_config`) and add a few flags of their own, so a flag means the same there as here.

:func:`load_config` checks every value before any process group exists, so a typo fails in a second
with a message naming the field and where the value came from: the task, unknown keys, wrong types and
out-of-range values (the dataclass's own checks), then what this machine must provide (paths that
must exist, and what the settings class checks itself: an encoder's uncached hub name while ``HF_HUB_OFFLINE``
is set) and a global batch smaller than the world size, all as a :class:`~distqa.config.ConfigError`. A
settings class's own rules come in through its hooks (:meth:`~distqa.config.Config.settle_sources`,
:meth:`~distqa.config.Config.check_machine`): nothing here knows a task. A fork's settings class that declares a
setting wrongly is refused by :func:`~distqa.config.values.check_declarations`, naming the setting.

Which ``.env``, for every entry point and script (``scripts/common.sh``): ``$ENV_FILE`` (refused when it names no
file), else ``.env`` in the working directory (:func:`dotenv_file`). Print every setting with its meaning:
``python -m distqa.train --help``; regenerate ``.env.example`` with ``python -m distqa.config.sources >
.env.example``."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dotenv import dotenv_values

from distqa.config import (
    DEFAULT_PRESET,
    ENV_PREFIX,
    PRESETS_DIR,
    REPO_ROOT,
    Config,
    ConfigError,
    fields_of,
    require_existing,
    resolve_path,
)
from distqa.config.flags import (
    RENAMED,
    SectionsOf,
    add_setting_flags,
    build_arg_parser,
    coerce_flag,
    ordered_sections,
    parse_flags,
    train_sections,
)
from distqa.config.presets import read_preset
from distqa.config.registry import available_tasks, other_tasks_settings, task_class
from distqa.config.values import check_declarations, coerce
from distqa.upkeep.project import PROJECT, ProjectError, split_setting

log = logging.getLogger(__name__)


def load_config(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] | None = None,
    prog: str = "python -m distqa.train",
    sections: SectionsOf = train_sections,
    description: str = "",
    default_task: str | None = None,
    check_data_paths: bool = True,
) -> Config:
    """Resolve defaults < preset < .env/environment < flags (those of ``sections``) into a checked config of
    the chosen task's class.

    ``dotenv_path`` defaults to :func:`dotenv_file`. ``environ`` defaults to ``os.environ``; its ``WORLD_SIZE``
    (set by torchrun) is used to check that the global batch splits evenly (after :meth:`Config.for_world_size`),
    so a bad batch size fails before any rendezvous. The config returned is the one given; the trainer scales it
    to its world size.
    ``default_task``: the entry point's task when no flag, variable or preset names one (None: the ``task``
    setting's default, ``dummy``).
    ``check_data_paths``: False where the caller reads the task's data files at once itself (``prepare``), so a
    missing one is named by the reader.
    """
    source = SettingSources.read(sys.argv[1:] if argv is None else argv,
                                 os.environ if environ is None else environ, dotenv_path, default_task)
    task = task_class(source.task)
    config_class = check_declarations(task.config_class)
    parser = build_arg_parser(prog, task, sections, description)
    flags = parse_flags(parser, source.argv, config_class, source.task)

    typed, later = source.typed(config_class, flags)
    values: dict[str, Any] = {"preset": source.preset, "task": source.task, **typed}
    config_class.settle_sources(values, later, source.preset_values, source.preset_path)

    config = config_class(**values)
    check_environment(config, check_data_paths)
    world_size = _world_size(os.environ if environ is None else environ)
    config.for_world_size(world_size).accumulation_steps(world_size)
    return config


@dataclasses.dataclass
class SettingSources:
    """The raw values of each source, read once: the preset's keys, the ``DISTQA_*`` variables (the .env file's
    under the environment's), and the command line; the preset and the task chosen from them."""

    argv: list[str]
    env: dict[str, str]
    preset: str
    preset_path: Path | None
    preset_values: dict[str, Any]
    task: str

    @classmethod
    def read(cls, argv: Sequence[str], environ: Mapping[str, str], dotenv_path: str | os.PathLike[str] | None,
             default_task: str | None = None) -> SettingSources:
        if dotenv_path is None:
            dotenv_path = dotenv_file(environ)
            if environ.get("ENV_FILE") and not dotenv_path.is_file():
                raise ConfigError(f"ENV_FILE={dotenv_path}: no such file; name an existing file, or unset ENV_FILE "
                                  "to read .env in the working directory.")
        merged = {**_read_dotenv(Path(dotenv_path)), **environ}
        env = {k: v for k, v in merged.items() if k.startswith(ENV_PREFIX) and k != ENV_PREFIX + "PRESET"}
        early, _ = _early_parser().parse_known_args(argv)
        given = "--preset" if early.preset else f"{ENV_PREFIX}PRESET" if merged.get(ENV_PREFIX + "PRESET") else ""
        # A fork that deleted the built-in tasks may delete their presets, the default one among them.
        default = DEFAULT_PRESET if (PRESETS_DIR / f"{DEFAULT_PRESET}.toml").is_file() else "none"
        preset = read_preset(early.preset or merged.get(ENV_PREFIX + "PRESET") or default)
        # The task decides which settings exist, so it is chosen first, by the same precedence.
        task = default_task or fields_of(Config)["task"].default
        task = _take_task(preset.values, "task", f"preset {preset.path}") or task
        task = _take_task(env, ENV_PREFIX + "TASK", "the environment") or task
        task = early.task or task
        if not preset.is_for(task):  # the default preset is left out of another task's run; a given one refused
            if given:
                raise ConfigError(preset.refusal(given, task))
            preset = read_preset("none")
        return cls(list(argv), env, preset.name, preset.path, preset.values, task)


    def typed(self, config_class: type[Config], flags: Mapping[str, Any],
              only: Sequence[str] = ()) -> tuple[dict[str, Any], set[str]]:
        """The settings of ``config_class`` that the preset, the environment and ``flags`` give, typed, each
        source over the one before, and the names the environment or a flag set. ``only``: those settings alone,
        the other keys unread; else a key that is no setting is refused (:func:`_refuse_unknown`)."""
        wanted = set(only or fields_of(config_class))
        values: dict[str, Any] = {}
        later: set[str] = set()
        for name, raw in self.preset_values.items():
            if name in wanted:
                values[name] = coerce(name, raw, f"preset {self.preset_path}", config_class)
            elif not only:
                _refuse_unknown(name, config_class, f"preset {self.preset_path}: unknown key {name!r}",
                                f"preset {self.preset_path}")
        for key, raw in self.env.items():
            if (name := key[len(ENV_PREFIX):].lower()) in wanted:
                values[name] = coerce(name, raw, f"environment variable {key}", config_class)
                later.add(name)
            elif not only:
                _refuse_unknown(name, config_class, f"environment variable {key} is not a setting", "")
        for name, raw in flags.items():
            values[name] = coerce_flag(name, raw, config_class)
            later.add(name)
        return values, later


def _take_task(values: dict[str, Any], key: str, place: str) -> str | None:
    """Take the task out of one source's values; None if it has none."""
    chosen = values.pop(key, None)
    if chosen is not None and not isinstance(chosen, str):
        raise ConfigError(f"task: invalid value {chosen!r} from {place}: expected a string.")
    return chosen


def _early_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--preset", "--task"):
        parser.add_argument(flag)
    return parser


def run_task(argv: Sequence[str], environ: Mapping[str, str] | None = None, project: Path = REPO_ROOT / PROJECT) -> str:
    """The task a run of this project with ``argv`` trains, chosen as ``python -m distqa.train`` chooses it, over
    ``project.toml``'s ``[run] args`` (the fork's preset): what the commands ask that have no checkpoint to ask
    (``--help`` of predict, evaluate and export; score's default ``--format``). Imports no task."""
    environ = os.environ if environ is None else environ
    try:
        flags = split_setting(project, "run.args", dict(environ))
    except ProjectError:  # a checkout without a readable project.toml: the settings alone
        flags = []
    return SettingSources.read([*flags, *argv], environ, None).task


def saved_config(saved: Mapping[str, Any], **overrides: Any) -> Config:
    """The config a checkpoint or ``config.json`` was written with, in its task's settings class, with
    ``overrides``. Its values are checked, but not against this machine: inference needs the model, tokenizer
    and window settings, not the training file or the checkpoint to resume, which need not exist here.
    Another task's settings (an older layout kept every task's) are dropped; settings no registered task knows are
    dropped with a warning."""
    values = dict(saved)
    config_class = task_class(values.get("task", fields_of(Config)["task"].default)).config_class
    known = fields_of(config_class)
    # The other tasks are imported only when the checkpoint holds settings this task lacks (an older layout).
    others = set().union(*other_tasks_settings(config_class).values()) if set(values) - set(known) else set()
    unknown = sorted(name for name in values if name not in known and name not in others)
    if unknown:
        log.warning("ignoring settings this version does not know: %s", ", ".join(unknown))
    return config_class(**{name: value for name, value in values.items() if name in known} | overrides)


def check_environment(config: Config, check_data_paths: bool = True) -> None:
    """What this machine must provide for ``config``: local paths that exist (every setting declared with
    ``must_exist``), what its settings class checks itself (:meth:`~distqa.config.Config.check_machine`: an
    encoder's local model, or hub names while ``HF_HUB_OFFLINE`` is set), a checkpoint to resume, the tracker's
    address.
    The entry points call it (through :func:`load_config`); a config rebuilt from a checkpoint for inference skips
    it, since the training data need not exist there."""
    for name, f in fields_of(type(config)).items():
        if f.metadata.get("must_exist") and check_data_paths:
            require_existing(resolve_path(getattr(config, name)), name, f.metadata["must_exist"])
    config.check_machine()
    if config.resume not in ("auto", "none"):
        require_existing(Path(config.resume), "resume", "use 'auto', 'none' or a checkpoint file written by an "
                         "earlier run")
    if config.tracker == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        raise ConfigError("tracker: 'mlflow' needs MLFLOW_TRACKING_URI (the server's http(s) address) in the "
                          "environment or .env; or --tracker none.")


def _refuse_unknown(name: str, config_class: type[Config], message: str, ignored_in: str) -> None:
    """A key that is no setting of ``config_class``: ignored when another registered task has it (a preset or a
    .env may serve several tasks; said in one line for a preset), a ConfigError naming the key otherwise."""
    owners = [task for task, fields in other_tasks_settings(config_class).items() if name in fields]
    if name in RENAMED:
        raise ConfigError(f"{message}; it was renamed {RENAMED[name]} (CHANGELOG.md): write {RENAMED[name]} instead.")
    if not owners:
        known = [*fields_of(config_class), *set().union(*other_tasks_settings(config_class).values())]
        close = difflib.get_close_matches(name, known, n=1)
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{message}; {suggestion}remove it or see `python -m distqa.train --help`.")
    if ignored_in:
        log.warning("%s: ignoring %s, a setting of task %s, not of this run's", ignored_in, name, " and ".join(owners))


def dotenv_file(environ: Mapping[str, str] | None = None) -> Path:
    """The ``.env`` every entry point and script (scripts/common.sh) reads: ``$ENV_FILE``, else ``./.env``."""
    return Path((os.environ if environ is None else environ).get("ENV_FILE") or ".env")


def _read_dotenv(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def _world_size(environ: Mapping[str, str]) -> int:
    raw = environ.get("WORLD_SIZE", "1")
    try:
        world_size = int(raw)
    except ValueError:
        world_size = 0
    if world_size < 1:
        raise ConfigError(f"WORLD_SIZE={raw!r} is not a positive integer; it is set by torchrun, "
                          "do not set it by hand.")
    return world_size


def env_example() -> str:
    """The text of ``.env.example``: every setting of every registered task whose module is here, as a commented
    ``DISTQA_*`` line with its help; a setting that not every task has names the tasks that have it. Sections come
    in ``--help``'s order (:func:`~distqa.config.flags.ordered_sections`)."""
    # With no registered task here (a fork deleted them and registered none), the settings every run has.
    classes = {name: task_class(name).config_class for name in available_tasks()} or {"any": Config}
    everything: dict[str, dataclasses.Field[Any]] = {}  # a setting several tasks declare: in its first one's section
    helps: dict[str, dict[str, list[str]]] = {}  # setting -> its help -> the tasks that declare it with that help
    for task, config_class in classes.items():
        for name, f in fields_of(config_class).items():
            everything.setdefault(name, f)
            helps.setdefault(name, {}).setdefault(f.metadata["help"], []).append(task)
    lines = [
        "# Copy to .env and uncomment what you need. Precedence: defaults < preset < .env < environment",
        "# < command-line flags. Regenerate this file with: python -m distqa.config.sources > .env.example",
        "# Settings of another task than the run's are ignored, so one .env can serve several tasks.",
        "",
    ]
    for section in ordered_sections(f.metadata["section"] for f in everything.values()):
        names = [name for name, f in everything.items() if f.metadata["section"] is section]
        lines += [f"# --- {section.title} ---", ""]
        for name in names:
            f = everything[name]
            having = [task for task, config_class in classes.items() if name in fields_of(config_class)]
            only = f"[task {', '.join(having)}] " if len(having) < len(classes) else ""
            default = "none" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) \
                else f.default
            if len(helps[name]) == 1:
                lines.append(f"# {only}{f.metadata['help']}")
            else:  # the same setting, worded for each task that has it
                lines += [f"# [task {', '.join(tasks)}] {text}" for text, tasks in helps[name].items()]
            lines += [f"# {ENV_PREFIX}{name.upper()}={default}", ""]
    lines += [
        "# Not settings of distqa, but read by the libraries it uses (.env is loaded into the environment; every entry",
        "# point and script reads $ENV_FILE, else .env in the working directory):",
        "# MLFLOW_TRACKING_URI=http://127.0.0.1:5000 # the MLflow server of --tracker mlflow",
        "# MLFLOW_TRACKING_USERNAME=me               # its credentials, if it asks for any: user and password",
        "# MLFLOW_TRACKING_PASSWORD=...              # (never logged, never a parameter of the run),",
        "# MLFLOW_TRACKING_TOKEN=...                 # or a token",
        "# MLFLOW_TOKEN_SECRET=secret:NAME           # platform runs: the secret that holds the token",
        "# MLFLOW_HTTP_REQUEST_TIMEOUT=10            # seconds per request to the server (distqa: 10)",
        "# MLFLOW_HTTP_REQUEST_MAX_RETRIES=2         # retries of a failed request (distqa: 2)",
        "# HF_HOME=/data/hf-cache                    # where transformers caches downloaded models",
        "# HF_HUB_OFFLINE=1                          # never reach the hub (every default path is offline)",
        "# NCCL_SOCKET_IFNAME=eth0                   # network interface NCCL uses between nodes",
        "# GLOO_SOCKET_IFNAME=eth0                   # the same for gloo (CPU runs)",
        "# NCCL_DEBUG=INFO                           # print NCCL's topology and transport choices",
    ]
    return "\n".join(lines) + "\n"


def run_dir_of(argv: Sequence[str], environ: Mapping[str, str] | None = None,
               dotenv_path: str | os.PathLike[str] | None = None) -> Path:
    """``output_dir / run_name`` as ``python -m distqa.train ARGV`` resolves them (same sources, same precedence),
    read without the task's settings: ``scripts/worker.sh`` asks before every start of a node, which should not
    wait for torch to import. The rest of ARGV is the trainer's to check."""
    source = SettingSources.read(argv, os.environ if environ is None else environ, dotenv_path)
    names = ("output_dir", "run_name")
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_setting_flags(parser, names, Config)
    values, _ = source.typed(Config, vars(parser.parse_known_args(source.argv)[0]), only=names)
    return Config(**values).run_dir


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.config.sources`` prints .env.example (``make env-example``);
    ``python -m distqa.config.sources --run-dir [TRAINER ARGS...]`` prints the run directory that
    ``python -m distqa.train TRAINER ARGS`` would use (``scripts/worker.sh`` points the flight recorder there),
    or exits 2 with the configuration error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["--run-dir"]:
        print(env_example(), end="")
        return 0
    try:
        print(run_dir_of(args[1:]))
    except ConfigError as err:
        print(f"distqa.config.sources: configuration error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
