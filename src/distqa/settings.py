"""Where the settings of a run come from, and which of them each entry point accepts.

Precedence, lowest to highest::

    built-in defaults  <  preset file (configs/NAME.toml)  <  .env file and environment
    variables (DISTQA_<FIELD>)  <  command-line flags (--field-name VALUE)

The preset is picked with ``--preset NAME`` (or ``DISTQA_PRESET``); ``tiny-cpu`` is the default and
``--preset none`` uses the built-in defaults alone. A preset and the environment describe a whole run,
so they may set any setting; the command line of each entry point accepts (and ``--help`` shows) only
the sections of :class:`~distqa.config.Config` it uses: :data:`TRAIN` (all of them) and :data:`PREPARE`.
``predict`` and ``evaluate`` take the checkpoint's settings and add a few flags of their own with
:func:`add_setting_flags`, so a flag means the same there as here.

:func:`load_config` checks every value before any process group exists, so a typo fails in a second
with a message naming the field and where the value came from: unknown keys, wrong types and
out-of-range values (the dataclass's own checks), then what this machine must provide (paths that
must exist, a hub name while ``HF_HUB_OFFLINE`` is set) and a global batch that the world size
cannot split, all as a :class:`~distqa.config.ConfigError`.

Print every setting with its meaning: ``python -m distqa.train --help``; regenerate ``.env.example``
with ``python -m distqa.settings > .env.example``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values

from distqa.config import (
    CONSOLE,
    DEFAULT_PRESET,
    ENCODER,
    ENV_PREFIX,
    FIELDS,
    NQ_FILES,
    PRESET,
    PRESETS_DIR,
    REPO_ROOT,
    SECTIONS,
    WINDOWS,
    Config,
    ConfigError,
    Section,
    resolve_path,
)

TRAIN = SECTIONS
"""``python -m distqa.train``: every setting."""
PREPARE = (PRESET, ENCODER, WINDOWS, NQ_FILES, CONSOLE)
"""``python -m distqa.prepare``: what determines the NQ feature cache and how it is built."""

_TYPES = typing.get_type_hints(Config)


def section_fields(sections: Iterable[Section]) -> list[str]:
    """The names of the settings of ``sections``, in field order."""
    names = {section.name for section in sections}
    return [name for name, f in FIELDS.items() if f.metadata["section"] in names]


def load_config(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] = ".env",
    prog: str = "python -m distqa.train",
    sections: Sequence[Section] = TRAIN,
    description: str = "",
) -> Config:
    """Resolve defaults < preset < .env/environment < flags (those of ``sections``) into a checked
    :class:`Config`.

    ``environ`` defaults to ``os.environ``; its ``WORLD_SIZE`` (set by torchrun) is used to check
    that the global batch splits evenly (after :meth:`Config.for_world_size`), so a bad batch size fails
    before any rendezvous. The config returned is the one given; the trainer scales it to its world size.
    """
    environ = os.environ if environ is None else environ
    flags = vars(build_arg_parser(prog, sections, description).parse_args(argv))
    env = {**_read_dotenv(Path(dotenv_path)), **environ}

    preset = flags.pop("preset", None) or env.get(ENV_PREFIX + "PRESET") or DEFAULT_PRESET
    values: dict[str, Any] = {"preset": preset}
    values |= _read_preset(preset)
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key == ENV_PREFIX + "PRESET":
            continue
        name = key[len(ENV_PREFIX):].lower()
        if name not in FIELDS:
            raise ConfigError(f"environment variable {key} is not a setting; "
                              f"{_suggest(name)}remove it or see `python -m distqa.train --help`.")
        values[name] = _coerce(name, raw, f"environment variable {key}")
    for name, raw in flags.items():
        values[name] = coerce_flag(name, raw)

    config = Config(**values)
    check_environment(config)
    world_size = _world_size(environ)
    config.for_world_size(world_size).accumulation_steps(world_size)
    return config


def build_arg_parser(prog: str = "python -m distqa.train", sections: Sequence[Section] = TRAIN,
                     description: str = "") -> argparse.ArgumentParser:
    """The command line of an entry point: one ``--field-name`` flag per setting of ``sections``,
    grouped by section, with the help of the field docs."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(description + " " if description else "") + "Precedence of settings: defaults < --preset "
        "file < .env / DISTQA_* environment variables < these flags.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    for section in sections:
        add_setting_flags(parser.add_argument_group(section.title), section_fields((section,)))
    return parser


def add_setting_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, names: Iterable[str],
                      aliases: Mapping[str, str] | None = None, show_defaults: bool = True) -> None:
    """``--field-name`` flags for the settings ``names`` (raw strings: :func:`coerce_flag` types them);
    ``aliases`` adds another flag for a setting (name -> flag). ``show_defaults`` False leaves the
    built-in defaults out of the help, where they are not what applies (predict: the checkpoint's)."""
    for name in names:
        f = FIELDS[name]
        flags = ["--" + name.replace("_", "-"), *([aliases[name]] if aliases and name in aliases else [])]
        parser.add_argument(*flags, dest=name, metavar=_metavar(name), default=argparse.SUPPRESS,
                            help=f"{f.metadata['help']}" + (f" (default: {f.default})" if show_defaults else ""))


def coerce_flag(name: str, raw: Any) -> Any:
    """The typed value of the flag of setting ``name``; ConfigError naming the flag otherwise."""
    return _coerce(name, raw, f"flag --{name.replace('_', '-')}")


def check_environment(config: Config) -> None:
    """What this machine must provide for ``config``: local paths that exist, and no hub name while
    ``HF_HUB_OFFLINE`` is set. The entry points call it (through :func:`load_config`); a Config built
    from a checkpoint for inference skips it, since the training data need not exist there."""
    if config.dataset == "nq":
        _require_local(resolve_path(config.nq_train_file), "nq_train_file", hint=(
            "generate one with `python -m distqa.data.synthetic_nq`, or download the real data "
            "with scripts/download_nq.sh (see data/README.md)"))
    for name in ("model_name_or_path", "tokenizer_name_or_path"):
        value = getattr(config, name)
        if value and (_looks_local(value) or _hub_offline()):
            _require_local(resolve_path(value), name)
    if config.resume not in ("auto", "none"):
        _require_local(Path(config.resume), "resume", hint="use 'auto', 'none' or a "
                       "checkpoint file written by an earlier run")


def _require_local(path: Path, name: str, hint: str = "") -> None:
    if not path.exists():
        hint = hint or ("pass an existing directory, or a hub name such as "
                        "bert-base-uncased (downloaded on first use, so not with HF_HUB_OFFLINE=1)")
        raise ConfigError(f"{name}: {path} does not exist; {hint}.")


def _read_dotenv(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def _read_preset(preset: str) -> dict[str, Any]:
    if preset == "none":
        return {}
    path = Path(preset) if preset.endswith(".toml") else PRESETS_DIR / f"{preset}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
        raise ConfigError(f"preset {preset!r}: {path} does not exist; choose one of {known}, "
                          "'none', or a path to a .toml file.")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"preset {path}: not valid TOML ({err}).") from err
    values = {}
    for name, raw in data.items():
        if name not in FIELDS or name == "preset":
            raise ConfigError(f"preset {path}: unknown key {name!r}; {_suggest(name)}"
                              "remove it or see `python -m distqa.train --help`.")
        values[name] = _coerce(name, raw, f"preset {path}")
    return values


def _coerce(name: str, raw: Any, source: str) -> Any:
    """Turn a raw value (a string from the environment or a flag, or a TOML value) into the
    field's type, or raise a ConfigError that names the field and where the value came from."""
    hint = _TYPES[name]
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if optional and (raw is None or (isinstance(raw, str) and raw.lower() in ("", "none"))):
        return None
    try:
        return _parse(base, raw)
    except ValueError as err:
        raise ConfigError(f"{name}: invalid value {raw!r} from {source}: {err}.") from None


def _parse(kind: Any, raw: Any) -> Any:
    """Strings (environment, flags) are parsed; TOML values must already have the right type."""
    if typing.get_origin(kind) is Literal:
        if raw not in typing.get_args(kind):
            raise ValueError(f"choose one of {list(typing.get_args(kind))}")
        return raw
    if kind is bool:
        if isinstance(raw, str) and raw.lower() in _BOOLEANS:
            return _BOOLEANS[raw.lower()]
        if not isinstance(raw, bool):
            raise ValueError("expected true or false")
        return raw
    if kind in (int, float):
        expected = "an integer" if kind is int else "a number"
        allowed = (int, str) if kind is int else (int, float, str)
        if isinstance(raw, bool) or not isinstance(raw, allowed):
            raise ValueError(f"expected {expected}")
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"expected {expected}") from None
    if kind is str:
        if not isinstance(raw, str):
            raise ValueError("expected a string")
        return raw
    raise TypeError(f"unsupported config field type {kind}")


_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}


def _metavar(name: str) -> str:
    if choices := _choices(name):
        return "{" + ",".join(choices) + "}"
    return getattr(_TYPES[name], "__name__", "VALUE").upper()


def _choices(name: str) -> tuple[str, ...]:
    hint = _TYPES[name]
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, FIELDS, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _looks_local(name: str) -> bool:
    """A name whose first path component exists here is meant as a local path (data/tiny-bert);
    hub names (bert-base-uncased, google/bert_uncased_L-2_H-128_A-2) have no such directory."""
    first = Path(name).parts[0] if Path(name).parts else name
    return name.startswith(("/", ".", "~")) or any(
        (base / first).exists() for base in (Path.cwd(), REPO_ROOT))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


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
    """The text of ``.env.example``: every setting as a commented ``DISTQA_*`` line with its help."""
    lines = [
        "# Copy to .env and uncomment what you need. Precedence: defaults < preset < .env < environment",
        "# < command-line flags. Regenerate this file with: python -m distqa.settings > .env.example",
        "",
    ]
    for section in SECTIONS:
        lines += [f"# --- {section.title} ---", ""]
        for name in section_fields((section,)):
            f = FIELDS[name]
            default = "none" if f.default is None else str(f.default).lower() if isinstance(f.default, bool) \
                else f.default
            lines += [f"# {f.metadata['help']}", f"# {ENV_PREFIX}{name.upper()}={default}", ""]
    lines += [
        "# Not settings of distqa, but read by the libraries it uses (.env is loaded into the environment):",
        "# HF_HOME=/data/hf-cache            # where transformers caches downloaded models",
        "# HF_HUB_OFFLINE=1                  # never reach the hub (every default path is offline)",
        "# NCCL_SOCKET_IFNAME=eth0           # network interface NCCL uses between nodes",
        "# GLOO_SOCKET_IFNAME=eth0           # the same for gloo (CPU runs)",
        "# NCCL_DEBUG=INFO                   # print NCCL's topology and transport choices",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m distqa.settings`` prints .env.example (``make env-example``);
    ``python -m distqa.settings --run-dir [TRAINER ARGS...]`` prints the run directory that
    ``python -m distqa.train TRAINER ARGS`` would use (``scripts/worker.sh`` points the flight recorder there),
    or exits 2 with the configuration error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["--run-dir"]:
        print(env_example(), end="")
        return 0
    try:
        print(load_config(args[1:]).run_dir)
    except ConfigError as err:
        print(f"distqa.settings: configuration error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
