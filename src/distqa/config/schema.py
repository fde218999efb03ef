"""The typed settings of every run: a documented field per setting, grouped in sections, one class per task.

:class:`Config` holds what every run has, whatever it trains (run directory, optimisation, distribution,
checkpoints, logging). A task extends it with its own fields, declared next to its code, in a chain a fork
can start from anywhere (the built-in tasks': ``EncoderConfig`` in ``encoders/config.py`` adds a ``transformers``
encoder, ``QAConfig`` in ``qa/config.py`` its question-answering windows, each task's own ``config`` module what
that task reads; docs/FORKING.md). Every field is made by a :class:`Section`, which gives it its help text, its
section of ``--help`` and ``.env.example``, and says whether it defines the run. The sections defined here are
the machinery's (:data:`SECTIONS`, shown first in a fixed order); a task's own come after them, in field order.

A config checks its values (types, ranges, consistency) when it is built, and nothing else: what the
machine must provide (paths that exist, network access to the hub) is checked by the entry points
through :func:`distqa.config.sources.load_config`, which also says where values come from (defaults < preset
< .env and ``DISTQA_*`` variables < flags) and which sections each entry point accepts. A settings class adds
its own rules there through two hooks: :meth:`Config.settle_sources` (values that depend on which source set
them) and :meth:`Config.check_machine` (what the machine must provide besides the ``must_exist`` paths).

The settings that define a run (a checkpoint of other values of them is not resumed) are marked once,
on their fields (``defines_run``), and listed by :meth:`Config.run_defining`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ENV_PREFIX = "DISTQA_"
REPO_ROOT = Path(__file__).resolve().parents[3]
PRESETS_DIR = REPO_ROOT / "configs"
DEFAULT_PRESET = "tiny-cpu"


class ConfigError(ValueError):
    """A setting is unknown, malformed or inconsistent; the message names it and the fix."""


@dataclass(frozen=True)
class Section:
    """A group of settings that belong together; entry points accept and show whole sections, so a value
    means the same thing everywhere. A fork declares its task's settings with a section of its own::

        TEXT = Section("text_classification", "text classification")

        @dataclass
        class TextConfig(Config):
            data_file: str = TEXT("data.tsv", "Labelled lines, label TAB text.", defines_run=True)
    """

    name: str
    title: str

    def __call__(self, default: Any, help: str, defines_run: bool | tuple[str, ...] = False,
                 must_exist: str = "") -> Any:
        """A field of this section with its documentation (shown by ``--help`` and in .env.example).

        ``defines_run`` marks the settings that define what a checkpoint was trained on: True for every task
        that has the setting, or the names of the tasks it defines (a setting several tasks share may define
        only some of them). A run does not resume from a checkpoint with other values of them.
        ``must_exist``: the setting names a file or folder that must exist on the machine that trains; the
        text says how to get one (it ends the error message).
        """
        return field(default=default, metadata={"help": help, "section": self, "defines_run": defines_run,
                                                "must_exist": must_exist})


PRESET = Section("preset", "where the other values start from")
TASK = Section("task", "task")
RUN = Section("run", "run and output")
MODEL = Section("model", "model")
DATA = Section("data", "training data")
OPTIMISATION = Section("optimisation", "optimisation")
EVALUATION = Section("evaluation", "evaluation and decoding")
DISTRIBUTED = Section("distributed", "distributed")
CHECKPOINTS = Section("checkpoints", "checkpoints")
LOGGING = Section("logging", "logging")
CONSOLE = Section("console", "console")
SECTIONS = (PRESET, TASK, RUN, DATA, OPTIMISATION, EVALUATION, DISTRIBUTED, CHECKPOINTS, LOGGING, CONSOLE)
"""The machinery's sections, in the order ``--help`` and .env.example show them; a task's own sections follow, in
the order of its fields. ``DATA`` and ``EVALUATION`` are generic: a task adds its settings of its data and its
evaluation there. So is ``MODEL``, which holds no setting of every run: it is a task's section, shown where its
first field comes."""


@dataclass
class Config:
    """What every run needs to know, whatever its task; see the module docstring for where values come from."""

    # --- where the other values start from ---------------------------------------------------------
    preset: str = PRESET(
        DEFAULT_PRESET, "Preset file configs/NAME.toml (or a path to a .toml) applied over the "
        "defaults; 'none' for the bare defaults. Set with --preset or DISTQA_PRESET only.")

    # --- task --------------------------------------------------------------------------------------
    task: str = TASK(
        "dummy", "What the run trains and how it is scored: a registered task (--help lists those here; 'dummy', "
        "offline synthetic data, by default) or a fork's own as package.module:ClassName (docs/FORKING.md).",
        defines_run=True)

    # --- run and output ----------------------------------------------------------------------------
    run_name: str = RUN(
        "local", "Name of the run directory under output_dir. Restarts with the same name resume "
        "from its checkpoints (--resume auto); all nodes of a run must use the same name.")
    output_dir: str = RUN(
        "results", "Directory holding run directories. Must be shared storage when nodes resume.")
    seed: int = RUN(1234, "Seed for model initialisation, data order and dropout.")

    # --- training data -----------------------------------------------------------------------------
    num_workers: int = DATA(0, "DataLoader worker processes per rank (0 = load in the trainer).")

    # --- optimisation ------------------------------------------------------------------------------
    global_batch_size: int = OPTIMISATION(
        32, "Examples per optimizer step over all ranks, whatever the world size: each rank takes a share (they "
        "differ by at most one) in micro-batches of per_rank_batch_size (the accumulation is derived from it).")
    per_rank_batch_size: int = OPTIMISATION(8, "Examples per forward pass on one rank (micro-batch).")
    grow_global_batch: bool = OPTIMISATION(
        False, "When per_rank_batch_size × world_size does not divide global_batch_size, grow the global batch to "
        "the next multiple (full micro-batches on every rank instead of uneven shares and padded rows), scale lr by "
        "the square root of the growth and keep the warm-up's examples (fewer steps). Not applied over an elastic "
        "node range (the batch would change with the membership).")
    lr: float = OPTIMISATION(5e-4, "Peak AdamW learning rate, reached at the end of the warm-up.")
    weight_decay: float = OPTIMISATION(0.01, "AdamW weight decay; biases and LayerNorm are never decayed.")
    warmup_steps: int = OPTIMISATION(10, "Optimizer steps of linear warm-up from 0 to lr.")
    lr_schedule: Literal["linear", "cosine", "constant"] = OPTIMISATION(
        "linear", "The learning rate after the warm-up: 'linear' falls to 0 at the last step, 'cosine' follows a "
        "half cosine to 0, 'constant' stays at lr (transformers' get_*_schedule_with_warmup).", defines_run=True)
    max_grad_norm: float = OPTIMISATION(1.0, "Clip the global gradient norm to this (0 = no clipping).")
    epochs: int = OPTIMISATION(1, "Passes over the training data (ignored when max_steps > 0).")
    max_steps: int = OPTIMISATION(0, "Optimizer steps of the whole run; 0 = as many as `epochs` gives. "
                                  "The learning-rate schedule ends here.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = OPTIMISATION(
        "auto", "Mixed precision: auto = bf16 on GPUs that support it, fp16 with loss scaling on "
        "older GPUs, fp32 on CPU. bf16 can be forced on CPU; fp16 needs a GPU.")
    compile: bool | None = OPTIMISATION(
        None, "torch.compile the model (TorchInductor: fused kernels, far fewer launches); its compile time "
        "is logged apart, once per process. none = on CUDA GPUs (1.46× on an H100), off on CPUs (slower there).")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = OPTIMISATION(
        "default", "torch.compile's mode when compiling: 'reduce-overhead' replays the step's kernels as CUDA "
        "graphs (fewer launches; one batch shape only: each new shape records new graphs, so the QA tasks refuse "
        "it with trim_padding or unpad), 'max-autotune-no-cudagraphs' tries more kernel variants (minutes of compile).")

    # --- evaluation --------------------------------------------------------------------------------
    eval_every: int = EVALUATION(
        0, "Evaluate on the task's validation data every N optimizer steps, and always at the end "
        "(0 = at the end only). All ranks share the work; the DummyDataset has no validation split.")
    eval_batch_size: int = EVALUATION(64, "Examples (windows) per forward pass on one rank in evaluation and predict.")
    early_stopping_patience: int = EVALUATION(
        0, "End the run after this many evaluations in a row that do not improve the task's best metric (the one "
        "that keeps best.pt) by more than early_stopping_min_delta: every rank stops at the same step, with a "
        "checkpoint, and exits 0. Needs eval_every > 0. 0 = never.")
    early_stopping_min_delta: float = EVALUATION(
        0.0, "How much an evaluation must beat the best so far by to count as an improvement for early stopping.")
    sweep_trial: str = EVALUATION(
        "", "Set by python -m distqa.sweep: SWEEP_DIR:N, the sweep trial this run is. After each evaluation rank 0 "
        "reports the best metric to the sweep's study and asks its pruner; a trial that falls behind the others at "
        "that step stops as early stopping does (every rank, a checkpoint, exit 0), as 'pruned'. Empty: no sweep.")

    # --- distributed -------------------------------------------------------------------------------
    device: Literal["auto", "cuda", "cpu"] = DISTRIBUTED(
        "auto", "auto = CUDA + NCCL when GPUs are present, else CPU + gloo. LOCAL_RANK picks the GPU.")
    dist_timeout_s: int = DISTRIBUTED(
        600, "Seconds a collective may wait for the other ranks before the run fails.")
    ddp_bucket_cap_mb: int = DISTRIBUTED(
        25, "Size of DDP's gradient buckets in MB: each is all-reduced as soon as backward has filled it, "
        "overlapping communication with the rest of the backward.")
    data_parallel: Literal["ddp", "fsdp", "hsdp"] = DISTRIBUTED(
        "ddp", "How the ranks share the model: 'ddp' keeps a whole replica (weights, gradients, optimizer state) "
        "on every rank; 'fsdp' shards them over all ranks (FSDP2: each rank holds 1/W of them and gathers a "
        "layer's weights for its forward and backward; for a model whose training state does not fit one GPU); "
        "'hsdp' shards within each node and replicates across nodes (the gathers stay on a node's fast links). "
        "A run resumes from a checkpoint of any of them.")
    ddp_comm_hook: Literal["none", "bf16"] = DISTRIBUTED(
        "none", "Gradient compression for the all-reduce: 'bf16' sends gradients as bf16 (half the bytes; "
        "for slow networks between nodes, docs/PERFORMANCE.md), 'none' sends them as they are.")

    # --- checkpoints -------------------------------------------------------------------------------
    resume: str = CHECKPOINTS(
        "auto", "'auto' continues from the newest checkpoint of this run if one exists, 'none' "
        "starts fresh, or a path to a checkpoint file or sharded checkpoint directory (step-N.dcp).")
    checkpoint_every: int = CHECKPOINTS(50, "Save a checkpoint every N optimizer steps (0 = only at the end).")
    keep_checkpoints: int = CHECKPOINTS(3, "Newest step checkpoints kept in the run directory.")
    save_on_peer_loss: bool = CHECKPOINTS(
        True, "When a collective fails because a peer is gone or stalled, each surviving rank that holds the last "
        "complete step whole (DDP; under hsdp with gloo, the ranks of a node that lost none of them, together) "
        "saves it before it leaves, so the resume redoes at most the step in flight (docs/FAULT_TOLERANCE.md, "
        "'A lost peer').")
    checkpoint_in_background: bool = CHECKPOINTS(
        True, "Rank 0 copies the step's state to host memory and writes the checkpoint in a background thread "
        "while training goes on (one write at a time; a stop and the end wait for it). false: training waits "
        "for each write, and no host copy is kept (a host short of memory).")
    checkpoint_format: Literal["file", "sharded", "auto"] = CHECKPOINTS(
        "auto", "'file': rank 0 writes one file per checkpoint (a sharded run gathers the whole state to rank 0); "
        "'sharded': every rank writes its own shards with torch.distributed.checkpoint into a directory "
        "step-N.dcp (docs/FAULT_TOLERANCE.md); 'auto': sharded when data_parallel is fsdp or hsdp on more than one "
        "rank (no rank then holds the whole state), file otherwise. best.pt is a file either way; a run resumes from "
        "either format at any world size.")
    stop_at_step: int = CHECKPOINTS(
        0, "End this invocation after this optimizer step, with a checkpoint, while the schedule "
        "still targets max_steps: splits a long run over time-limited jobs. 0 = never.")
    stop_check_every: int = CHECKPOINTS(
        10, "After SIGTERM/SIGINT (life span, preemption, Slurm's time limit, Ctrl-C) the ranks agree to "
        "stop, checkpoint and exit with code 75 at a step boundary; they check every N optimizer steps. "
        "A check is a one-element all-reduce (about 0.4 ms on CPU/gloo, bench/stop_check.py) but also a "
        "host sync on GPUs, hence not every step; the stop must finish within torchrun's shutdown timeout (30 s).")

    # --- logging -----------------------------------------------------------------------------------
    log_every: int = LOGGING(10, "Log loss, lr, samples/s and step time every N optimizer steps.")
    peak_tflops: float | None = LOGGING(
        None, "Dense bf16 peak TFLOP/s of one device, for the model-FLOPs utilisation (MFU) in the logs; none = "
        "looked up by GPU name (H100, H200, A100, L4, A10G, V100: distqa.record.throughput), no MFU on CPUs and "
        "unknown GPUs.")
    tensorboard: bool = LOGGING(True, "Write TensorBoard scalars to <run dir>/tensorboard (rank 0).")
    tracker: Literal["none", "mlflow"] = LOGGING(
        "none", "Where rank 0 also logs the run: 'mlflow' sends the resolved config as parameters and every "
        "TensorBoard scalar to the MLflow tracking server at MLFLOW_TRACKING_URI (credentials from "
        "MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN in the environment or .env), one MLflow run "
        "per training run across restarts; a server that cannot be reached costs one warning, not the run.")
    mlflow_experiment: str = LOGGING("distqa", "The MLflow experiment of the run (created when missing).")
    mlflow_parent_run: str = LOGGING(
        "", "The MLflow run whose child this run's MLflow run is (a sweep's run: python -m distqa.sweep sets it); "
        "empty: none.")

    # --- console -----------------------------------------------------------------------------------
    progress_bar: bool = CONSOLE(True, "Show a tqdm progress bar on rank 0.")

    def __post_init__(self) -> None:
        positive = ("global_batch_size", "per_rank_batch_size", "epochs", "dist_timeout_s", "ddp_bucket_cap_mb",
                    "keep_checkpoints", "log_every", "eval_batch_size", "stop_check_every")
        require_positive(self, positive)
        require_not_negative(self, ("num_workers", "warmup_steps", "max_steps", "checkpoint_every", "stop_at_step",
                                    "weight_decay", "max_grad_norm", "eval_every", "early_stopping_patience",
                                    "early_stopping_min_delta"))
        if self.early_stopping_patience and not self.eval_every:
            raise ConfigError(f"early_stopping_patience={self.early_stopping_patience} needs evaluations during the "
                              "run: set eval_every (say, to a tenth of the steps), or leave early stopping off (0).")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}; typical values are 1e-5 .. 1e-3.")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"peak_tflops must be > 0 or none, got {self.peak_tflops}.")
        if self.per_rank_batch_size > self.global_batch_size:
            raise ConfigError(
                f"per_rank_batch_size ({self.per_rank_batch_size}) is larger than global_batch_size "
                f"({self.global_batch_size}); lower it or raise global_batch_size.")
        if not self.run_name or "/" in self.run_name or self.run_name in (".", ".."):
            raise ConfigError(f"run_name must be a plain directory name, got {self.run_name!r}.")

    # --- derived values ---------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def for_world_size(self, world_size: int) -> Config:
        """This config as it runs on ``world_size`` ranks: itself, unless ``grow_global_batch`` is set and
        ``per_rank_batch_size × world_size`` does not divide ``global_batch_size``. Then the global batch
        becomes the next multiple of it, the learning rate grows by the square root of the growth (the
        square-root rule for Adam-type optimizers, which keeps the noise of a step's update about the same)
        and the warm-up covers the same number of examples in fewer steps (docs/CONFIGURATION.md, "Presets
        and scaling"). Without it an uneven split is trained as it is: shares that differ by one, short
        micro-batches padded (:meth:`accumulation_steps`)."""
        per_micro_step = self.per_rank_batch_size * world_size
        if not self.grow_global_batch or self.global_batch_size % per_micro_step == 0:
            return self
        grown = -(-self.global_batch_size // per_micro_step) * per_micro_step
        growth = grown / self.global_batch_size
        return dataclasses.replace(self, global_batch_size=grown, lr=self.lr * math.sqrt(growth),
                                   warmup_steps=math.ceil(self.warmup_steps / growth))

    def accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on every rank, so that every world size trains on the same global batch:
        the ranks take shares of it that differ by at most one example (ceil((global_batch_size - rank) /
        world_size), :mod:`distqa.distributed.sampler`), and the largest share needs ceil(share /
        per_rank_batch_size) micro-batches; a rank with a smaller share pads its last ones with rows weighed 0. A
        world size larger than the global batch would leave ranks with no example: a ConfigError."""
        if world_size > self.global_batch_size:
            raise ConfigError(
                f"global_batch_size ({self.global_batch_size}) is smaller than world_size ({world_size}): "
                f"{world_size - self.global_batch_size} rank(s) would have no example to train on. Use a "
                f"global_batch_size of at least {world_size}, fewer ranks, or --grow-global-batch true to let it grow.")
        largest_share = -(-self.global_batch_size // world_size)
        return -(-largest_share // self.per_rank_batch_size)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_defining(self) -> tuple[str, ...]:
        """The settings a checkpoint must share with this config to be resumed (``defines_run`` fields: those
        marked True, and those that name this config's task)."""
        marks = {f.name: f.metadata["defines_run"] for f in dataclasses.fields(self)}
        return tuple(name for name, mark in marks.items() if mark is True or (mark and self.task in mark))

    # --- hooks of a task's settings class -------------------------------------------------------------------
    @classmethod
    def settle_sources(cls, values: dict[str, Any], set_later: set[str], preset_values: Mapping[str, Any],
                       preset_path: Path | None) -> None:
        """Adjust ``values`` (typed, merged from every source, before the config is built) where a setting's value
        depends on which source set it: ``set_later`` names the settings that the environment or a flag set over
        the preset, whose raw values (file ``preset_path``) are ``preset_values``. A subclass calls super() first.
        Default: nothing (``EncoderConfig``'s: a preset's from_scratch)."""

    def check_machine(self) -> None:
        """A ConfigError when this machine lacks what these settings need, besides the ``must_exist`` paths that
        :func:`distqa.config.sources.check_environment` checks for every settings class (a local model that is
        missing, a hub name while offline). Runs in the entry points, not for a config rebuilt from a checkpoint.
        A subclass calls super() first. Default: nothing."""

    def refuse_another_run(self, saved: dict[str, Any], path: str) -> None:
        """ConfigError when the config ``saved`` in the checkpoint at ``path`` has other values of the run-defining
        settings: resuming would continue another run (other data, another model) as if it were this one."""
        current = self.to_dict()
        changed = [f"{n} {saved[n]!r} -> {current[n]!r}" for n in self.run_defining()
                   if n in saved and saved[n] != current[n]]
        if changed:
            raise ConfigError(f"the checkpoint {path} belongs to a run with other settings ({'; '.join(changed)}). "
                              "Use another --run-name for the new run, or --resume none to start this one over.")


def require_positive(config: Config, names: tuple[str, ...]) -> None:
    """ConfigError naming the first of the settings ``names`` that is not a positive number."""
    for name in names:
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(config, name)}.")


def require_not_negative(config: Config, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(config, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}.")


def require_existing(path: Path, name: str, hint: str) -> None:
    """ConfigError naming the setting ``name`` when ``path`` does not exist; ``hint`` (what to do) ends it."""
    if not path.exists():
        raise ConfigError(f"{name}: {path} does not exist; {hint}.")


def fields_of(config_class: type[Config]) -> dict[str, dataclasses.Field[Any]]:
    """Every setting of ``config_class`` by name, in field order."""
    return {f.name: f for f in dataclasses.fields(config_class)}


def resolve_path(name: str) -> Path:
    """Relative paths work from the current directory and, as the defaults need, from the repository."""
    path = Path(name).expanduser()
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path
