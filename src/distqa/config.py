"""One typed configuration for every run, and where its values come from.

Precedence, lowest to highest::

    built-in defaults  <  preset file (configs/NAME.toml)  <  .env file and environment
    variables (DISTQA_<FIELD>)  <  command-line flags (--field-name VALUE)

The preset is picked with ``--preset NAME`` (or ``DISTQA_PRESET``); ``tiny-cpu`` is the default and
``--preset none`` uses the built-in defaults alone. Every value is checked here, before any process
group exists, so a typo fails in a second with a message naming the field instead of after a
rendezvous: unknown keys, wrong types, out-of-range values, missing paths and a global batch that
the world size cannot split are all rejected with a :class:`ConfigError`.

Print every setting with its meaning: ``python -m distqa.train --help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values

ENV_PREFIX = "DISTQA_"
REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = REPO_ROOT / "configs"
DEFAULT_PRESET = "tiny-cpu"
TINY_MODEL_DIR = REPO_ROOT / "data" / "tiny-bert"


class ConfigError(ValueError):
    """A setting is unknown, malformed or inconsistent; the message names it and the fix."""


def setting(default: Any, help: str, defines_run: str = "") -> Any:
    """A config field with its documentation (shown by ``--help`` and in .env.example).

    ``defines_run`` marks the settings that define what a checkpoint was trained on ("any", or the
    dataset they belong to): a run does not resume from a checkpoint with other values of them.
    """
    return field(default=default, metadata={"help": help, "defines_run": defines_run})


@dataclass
class Config:
    """Everything a training run needs to know; see the module docstring for where values come from."""

    # --- run and output -------------------------------------------------------------------
    preset: str = setting(
        DEFAULT_PRESET, "Preset file configs/NAME.toml (or a path to a .toml) applied over the "
        "defaults; 'none' for the bare defaults. Set with --preset or DISTQA_PRESET only.")
    run_name: str = setting(
        "local", "Name of the run directory under output_dir. Restarts with the same name resume "
        "from its checkpoints (--resume auto); all nodes of a run must use the same name.")
    output_dir: str = setting(
        "results", "Directory holding run directories. Must be shared storage when nodes resume.")
    seed: int = setting(1234, "Seed for model initialisation, data order and dropout.")

    # --- model ------------------------------------------------------------------------------
    model_name_or_path: str = setting(
        str(TINY_MODEL_DIR.relative_to(REPO_ROOT)),
        "transformers encoder: a local directory or a hub name such as bert-base-uncased "
        "(hub names need network on first use). Relative paths are relative to the repository.", defines_run="any")
    from_scratch: bool = setting(
        True, "Initialise the encoder randomly from the model's config instead of loading its "
        "weights (the offline tiny model has no weights).")
    tokenizer_name_or_path: str = setting(
        "", "Tokenizer directory or hub name; empty means the same as model_name_or_path.")
    dropout: float | None = setting(
        None, "Override the encoder's hidden and attention dropout (0 <= p < 1); none keeps the "
        "model's own.")
    max_seq_len: int = setting(128, "Tokens per window: [CLS] question [SEP] document [SEP] + pad.", defines_run="any")
    max_question_len: int = setting(32, "Most question tokens kept in a window.", defines_run="any")

    # --- data -------------------------------------------------------------------------------
    dataset: Literal["dummy", "nq"] = setting(
        "dummy", "Training data: 'dummy' is the offline synthetic DummyDataset; 'nq' the Natural Questions "
        "features of nq_train_file, built once by `python -m distqa.prepare`.", defines_run="any")
    dummy_size: int = setting(4096, "Number of examples in the DummyDataset.", defines_run="dummy")
    num_workers: int = setting(0, "DataLoader worker processes per rank (0 = load in the trainer).")

    # --- Natural Questions features (part of the cache fingerprint unless noted) --------------
    nq_train_file: str = setting(
        "data/nq-sample/simplified-nq-train.jsonl", "Natural Questions train file in the Kaggle "
        "'simplified' jsonl format; the committed synthetic sample by default (data/README.md).", defines_run="nq")
    nq_cache_dir: str = setting(
        "data/nq-cache", "Where NQ feature caches live, one subdirectory per fingerprint of input "
        "file + tokenizer + window settings (not part of it). Shared storage on multi-node runs.")
    doc_stride: int = setting(
        64, "Document wordpieces between the starts of consecutive windows of one document; at most "
        "max_seq_len - max_question_len - 3.", defines_run="nq")
    negative_keep_rate: float = setting(
        0.1, "Fraction of training windows without an answer that are kept (0..1, deterministic by "
        "nq_seed); 1 keeps every window. Validation always keeps every window.", defines_run="nq")
    validation_fraction: float = setting(
        0.1, "Fraction of NQ examples held out for validation, by example and per answer type.", defines_run="nq")
    nq_seed: int = setting(
        0, "Seed of the validation split and the negative-window sampling; apart from seed, so that a "
        "new training seed reuses the cache.", defines_run="nq")
    on_bad_line: Literal["skip", "fail"] = setting(
        "skip", "A malformed NQ line is skipped and counted (reported at the end), or fails at once. "
        "Not part of the fingerprint.")
    max_bad_line_fraction: float = setting(
        0.01, "Refuse an NQ file with more than this fraction of malformed lines. Not part of the "
        "fingerprint.")
    num_proc: int = setting(
        0, "Processes that featurise NQ (prepare, or a single-process train that finds no cache); "
        "0 = one per CPU core (one per 16 MB for smaller files). Not part of the fingerprint.")

    # --- optimisation -----------------------------------------------------------------------
    global_batch_size: int = setting(
        32, "Examples per optimizer step over all ranks; must equal per_rank_batch_size × "
        "world_size × accumulation steps (the accumulation is derived from it).")
    per_rank_batch_size: int = setting(8, "Examples per forward pass on one rank (micro-batch).")
    lr: float = setting(5e-4, "Peak AdamW learning rate, reached at the end of the warm-up.")
    weight_decay: float = setting(0.01, "AdamW weight decay; biases and LayerNorm are never decayed.")
    warmup_steps: int = setting(10, "Optimizer steps of linear warm-up from 0 to lr.")
    max_grad_norm: float = setting(1.0, "Clip the global gradient norm to this (0 = no clipping).")
    epochs: int = setting(1, "Passes over the training data (ignored when max_steps > 0).")
    max_steps: int = setting(0, "Optimizer steps of the whole run; 0 = as many as `epochs` gives. "
                             "The learning-rate schedule ends here.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = setting(
        "auto", "Mixed precision: auto = bf16 on GPUs that support it, fp16 with loss scaling on "
        "older GPUs, fp32 on CPU. bf16 can be forced on CPU; fp16 needs a GPU.")

    # --- evaluation and decoding ------------------------------------------------------------
    eval_every: int = setting(
        0, "Evaluate on the NQ validation split every N optimizer steps, and always at the end "
        "(0 = at the end only). All ranks share the work; the DummyDataset has no validation split.")
    eval_batch_size: int = setting(64, "Windows per forward pass on one rank in evaluation and predict.")
    max_answer_len: int = setting(30, "Longest answer span the decoder considers, in wordpieces.")
    long_threshold: float | None = setting(
        None, "Give a long answer when its score (best span minus the [CLS] null score) exceeds this; "
        "none = tuned for micro-F1 on the validation split at every evaluation (stored in checkpoints).")
    short_threshold: float | None = setting(
        None, "The same for the short answer (span, YES or NO); none = tuned like long_threshold.")

    # --- distributed ------------------------------------------------------------------------
    device: Literal["auto", "cuda", "cpu"] = setting(
        "auto", "auto = CUDA + NCCL when GPUs are present, else CPU + gloo. LOCAL_RANK picks the GPU.")
    dist_timeout_s: int = setting(
        600, "Seconds a collective may wait for the other ranks before the run fails.")

    # --- checkpoints and logging -------------------------------------------------------------
    resume: str = setting(
        "auto", "'auto' continues from the newest checkpoint of this run if one exists, 'none' "
        "starts fresh, or a path to a checkpoint file.")
    checkpoint_every: int = setting(50, "Save a checkpoint every N optimizer steps (0 = only at the end).")
    keep_checkpoints: int = setting(3, "Newest step checkpoints kept in the run directory.")
    stop_at_step: int = setting(
        0, "End this invocation after this optimizer step, with a checkpoint, while the schedule "
        "still targets max_steps: splits a long run over time-limited jobs. 0 = never.")
    log_every: int = setting(10, "Log loss, lr, samples/s and step time every N optimizer steps.")
    progress_bar: bool = setting(True, "Show a tqdm progress bar on rank 0.")
    tensorboard: bool = setting(True, "Write TensorBoard scalars to <run dir>/tensorboard (rank 0).")

    def __post_init__(self) -> None:
        positive = ("max_seq_len", "max_question_len", "dummy_size", "global_batch_size",
                    "per_rank_batch_size", "epochs", "dist_timeout_s", "keep_checkpoints",
                    "log_every", "eval_batch_size", "max_answer_len")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        not_negative = ("num_workers", "warmup_steps", "max_steps", "checkpoint_every",
                        "stop_at_step", "weight_decay", "max_grad_norm", "num_proc", "nq_seed", "eval_every")
        for name in not_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}; typical values are 1e-5 .. 1e-3.")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1) or none, got {self.dropout}.")
        # [CLS] q [SEP] ... [SEP] must leave room for at least one document token.
        if self.max_question_len + 4 > self.max_seq_len:
            raise ConfigError(
                f"max_question_len ({self.max_question_len}) leaves no room for the document in "
                f"max_seq_len ({self.max_seq_len}); use max_question_len <= max_seq_len - 4.")
        if self.dataset == "nq":  # prepare checks it too, whatever the dataset (distqa.data.nq_request)
            self.check_doc_stride()
        for name in ("negative_keep_rate", "max_bad_line_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be between 0 and 1, got {getattr(self, name)}.")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}.")
        if self.dataset == "nq":
            self._require_local(_resolve(self.nq_train_file), "nq_train_file", hint=(
                "generate one with `python -m distqa.data.synthetic_nq`, or download the real data "
                "with scripts/download_nq.sh (see data/README.md)"))
        if self.per_rank_batch_size > self.global_batch_size:
            raise ConfigError(
                f"per_rank_batch_size ({self.per_rank_batch_size}) is larger than global_batch_size "
                f"({self.global_batch_size}); lower it or raise global_batch_size.")
        if not self.run_name or "/" in self.run_name or self.run_name in (".", ".."):
            raise ConfigError(f"run_name must be a plain directory name, got {self.run_name!r}.")
        for name in ("model_name_or_path", "tokenizer_name_or_path"):
            value = getattr(self, name)
            if value and (_looks_local(value) or _hub_offline()):
                self._require_local(_resolve(value), name)
        if self.resume not in ("auto", "none"):
            self._require_local(Path(self.resume), "resume", hint="use 'auto', 'none' or a "
                                "checkpoint file written by an earlier run")

    def check_doc_stride(self) -> None:
        room = self.max_seq_len - self.max_question_len - 3
        if not 1 <= self.doc_stride <= room:
            raise ConfigError(
                f"doc_stride ({self.doc_stride}) must be between 1 and the document part of a window, "
                f"max_seq_len - max_question_len - 3 = {room}; otherwise some text is in no window.")

    # --- derived values ---------------------------------------------------------------------
    @property
    def model_source(self) -> str:
        """What to hand to ``from_pretrained``: a resolved local directory or a hub name."""
        return _local_or_hub(self.model_name_or_path)

    @property
    def tokenizer_source(self) -> str:
        return _local_or_hub(self.tokenizer_name_or_path or self.model_name_or_path)

    @property
    def nq_train_path(self) -> Path:
        return _resolve(self.nq_train_file)

    @property
    def nq_cache_path(self) -> Path:
        return _resolve(self.nq_cache_dir)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step so that every world size trains on the same global batch."""
        per_micro_step = self.per_rank_batch_size * world_size
        if self.global_batch_size % per_micro_step:
            per_rank_share, remainder = divmod(self.global_batch_size, world_size)
            alternative = (f"or a per_rank_batch_size that divides {per_rank_share}" if not remainder else
                           f"({self.global_batch_size} cannot even be split evenly over {world_size} ranks)")
            raise ConfigError(
                f"global_batch_size ({self.global_batch_size}) is not divisible by "
                f"per_rank_batch_size ({self.per_rank_batch_size}) × world_size ({world_size}) = "
                f"{per_micro_step}. Use a global_batch_size that is a multiple of {per_micro_step}, "
                f"{alternative}.")
        return self.global_batch_size // per_micro_step

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_defining(self) -> tuple[str, ...]:
        """The settings a checkpoint must share with this config to be resumed (``defines_run`` fields)."""
        return tuple(f.name for f in dataclasses.fields(self) if f.metadata["defines_run"] in ("any", self.dataset))

    @staticmethod
    def _require_local(path: Path, name: str, hint: str = "") -> None:
        if not path.exists():
            hint = hint or ("pass an existing directory, or a hub name such as "
                            "bert-base-uncased (downloaded on first use, so not with HF_HUB_OFFLINE=1)")
            raise ConfigError(f"{name}: {path} does not exist; {hint}.")


# --- loading ---------------------------------------------------------------------------------

FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TYPES = typing.get_type_hints(Config)


def load_config(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike[str] = ".env",
    prog: str = "python -m distqa.train",
) -> Config:
    """Resolve defaults < preset < .env/environment < flags into a validated :class:`Config`.

    ``environ`` defaults to ``os.environ``; its ``WORLD_SIZE`` (set by torchrun) is used to check
    that the global batch splits evenly, so a bad batch size fails before any rendezvous.
    """
    environ = os.environ if environ is None else environ
    flags = vars(build_arg_parser(prog).parse_args(argv))
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
        values[name] = _coerce(name, raw, f"flag --{name.replace('_', '-')}")

    config = Config(**values)
    config.accumulation_steps(_world_size(environ))
    return config


def build_arg_parser(prog: str = "python -m distqa.train") -> argparse.ArgumentParser:
    """The command line: one ``--field-name`` flag per Config field, help from the field docs."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Precedence of settings: defaults < --preset file < .env / DISTQA_* "
        "environment variables < these flags.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, metavar=_metavar(name),
                            help=f"{f.metadata['help']} (default: {f.default})")
    return parser


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


def _resolve(name: str) -> Path:
    """Relative paths work from the current directory and, as the defaults need, from the repository."""
    path = Path(name).expanduser()
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def _local_or_hub(name: str) -> str:
    path = _resolve(name)
    return str(path) if path.exists() else name


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
        "# < command-line flags. Regenerate this file with: python -m distqa.config > .env.example",
        "",
    ]
    for name, f in FIELDS.items():
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


if __name__ == "__main__":
    print(env_example(), end="")
