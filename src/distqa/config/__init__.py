"""The settings of a run, in one package: what they are (:mod:`.schema`: :class:`Config`, :class:`Section`), the
types a value may have (:mod:`.values`), the presets (:mod:`.presets`), each entry point's flags (:mod:`.flags`)
and where values come from (:mod:`.sources`: defaults < preset < .env/env < flags).

A fork's task imports what it declares its settings with from here: ``from distqa.config import Config, Section``.
Free of torch, like every module of the package.
"""

from distqa.config.schema import (
    CHECKPOINTS,
    CONSOLE,
    DATA,
    DEFAULT_PRESET,
    DISTRIBUTED,
    ENV_PREFIX,
    EVALUATION,
    LOGGING,
    MODEL,
    OPTIMISATION,
    PRESET,
    PRESETS_DIR,
    REPO_ROOT,
    RUN,
    SECTIONS,
    TASK,
    Config,
    ConfigError,
    Section,
    fields_of,
    require_existing,
    require_not_negative,
    require_positive,
    resolve_path,
)

__all__ = [
    "CHECKPOINTS", "CONSOLE", "DATA", "DEFAULT_PRESET", "DISTRIBUTED", "ENV_PREFIX", "EVALUATION",
    "LOGGING", "MODEL", "OPTIMISATION", "PRESET", "PRESETS_DIR", "REPO_ROOT", "RUN", "SECTIONS",
    "TASK", "Config", "ConfigError", "Section", "fields_of",
    "require_existing", "require_not_negative", "require_positive", "resolve_path",
]
