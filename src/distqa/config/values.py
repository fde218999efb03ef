"""What types a setting may have, how a raw value becomes one, and the check of a settings class's declarations.

A raw value is a string (an environment variable, a ``.env`` line, a flag) or a TOML value (a preset); each
becomes the field's type, or a :class:`~distqa.config.ConfigError` that names the setting and where the value
came from. Settings are ``str``, ``int``, ``float``, ``bool``, a ``Literal`` of strings (and booleans: ``Literal["auto",
True, False]``, written ``auto``, ``true`` or ``false``), or one of them ``| None`` (written ``none`` on the command
line).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal

from distqa.config import Config, ConfigError, Section, fields_of


@functools.cache
def types_of(config_class: type[Config]) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def base_type(hint: Any) -> tuple[Any, bool]:
    """The type a setting's values have, and whether None is allowed too; TypeError for unsupported ones."""
    optional = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
    if isinstance(base, types.UnionType) or not (
            base in (str, int, float, bool) or (typing.get_origin(base) is Literal
                                                and all(isinstance(a, str | bool) for a in typing.get_args(base)))):
        raise TypeError(hint)
    return base, optional


def coerce(name: str, raw: Any, source: str, config_class: type[Config]) -> Any:
    """Turn a raw value (a string from the environment or a flag, or a TOML value) into the
    field's type, or raise a ConfigError that names the field and where the value came from."""
    base, optional = base_type(types_of(config_class)[name])
    if optional and (raw is None or (isinstance(raw, str) and raw.lower() in ("", "none"))):
        return None
    try:
        return parse_value(base, raw)
    except ValueError as err:
        raise ConfigError(f"{name}: invalid value {raw!r} from {source}: {err}.") from None


def parse_value(kind: Any, raw: Any) -> Any:
    """Strings (environment, flags) are parsed; TOML values must already have the right type."""
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        if isinstance(raw, str) and raw not in choices and True in choices and raw.lower() in BOOLEANS:
            raw = BOOLEANS[raw.lower()]  # a Literal with booleans: "true" is True
        if not any(raw == choice and type(raw) is type(choice) for choice in choices):
            raise ValueError(f"choose one of {[_written(choice) for choice in choices]}")
        return raw
    if kind is bool:
        if isinstance(raw, str) and raw.lower() in BOOLEANS:
            return BOOLEANS[raw.lower()]
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


BOOLEANS = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}


def _written(choice: str | bool) -> str:
    """A Literal's choice as it is written on the command line."""
    return str(choice).lower() if isinstance(choice, bool) else choice


def metavar(name: str, config_class: type[Config]) -> str:
    base, _ = base_type(types_of(config_class)[name])
    if typing.get_origin(base) is Literal:
        return "{" + ",".join(map(_written, typing.get_args(base))) + "}"
    return getattr(base, "__name__", "VALUE").upper()


@functools.cache
def check_declarations(config_class: type[Config]) -> type[Config]:
    """``config_class`` when each of its settings is declared as :func:`load_config` can read it: made by a
    Section with a help text, of a supported type, with a default of that type, marks of the right kind, and
    the type of the setting it may redefine; a ConfigError naming the setting and the fix otherwise."""
    if not dataclasses.is_dataclass(config_class):
        raise ConfigError(f"{config_class.__name__} is not a dataclass: decorate it with @dataclass.")
    hints = types_of(config_class)
    base = types_of(Config)
    where = f"{config_class.__module__}.{config_class.__name__}"
    for name, f in fields_of(config_class).items():
        fix = "declare it as MY_SECTION(default, 'what it means') with a distqa.config.Section (docs/FORKING.md)"
        if not isinstance(f.metadata.get("section"), Section) or not f.metadata.get("help"):
            raise ConfigError(f"setting {name!r} of {where} has no section or no help text; {fix}.")
        if name in base and hints[name] != base[name]:
            raise ConfigError(f"setting {name!r} of {where} redefines Config's {name} with another type "
                              f"({hints[name]} instead of {base[name]}); give it another name.")
        mark = f.metadata["defines_run"]
        if not (isinstance(mark, bool) or (isinstance(mark, tuple) and all(isinstance(t, str) for t in mark))):
            raise ConfigError(f"setting {name!r} of {where}: defines_run must be True, False or a tuple of task "
                              f"names, got {mark!r}.")
        try:
            kind, optional = base_type(hints[name])
            parse_value(kind, f.default) if not (optional and f.default is None) else None
        except TypeError:
            raise ConfigError(f"setting {name!r} of {where} has the type {hints[name]}, which settings cannot "
                              "have; use str, int, float, bool, a Literal of strings, or one of them | None."
                              ) from None
        except ValueError as err:
            raise ConfigError(f"setting {name!r} of {where}: its default {f.default!r} is not of its type "
                              f"{hints[name]} ({err}).") from None
    return config_class
