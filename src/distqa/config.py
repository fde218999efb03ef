"""One typed configuration for every run: a documented field per setting, grouped in sections.

:class:`Config` checks its values (types, ranges, consistency) when it is built, and nothing else: what
the machine must provide (paths that exist, network access to the hub) is checked by the entry points
through :func:`distqa.settings.load_config`, which also says where values come from (defaults < preset
< .env and ``DISTQA_*`` variables < flags) and which sections each entry point accepts.

The settings that define a run (a checkpoint of other values of them is not resumed) are marked once,
on their fields (``defines_run``), and listed by :meth:`Config.run_defining`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from distqa.data.windows import check_window_shape

ENV_PREFIX = "DISTQA_"
REPO_ROOT = Path(__file__).resolve().parents[2]
PRESETS_DIR = REPO_ROOT / "configs"
DEFAULT_PRESET = "tiny-cpu"
TINY_MODEL_DIR = REPO_ROOT / "data" / "tiny-bert"


class ConfigError(ValueError):
    """A setting is unknown, malformed or inconsistent; the message names it and the fix."""


@dataclass(frozen=True)
class Section:
    """A group of settings that belong together; entry points accept and show whole sections
    (``distqa.settings.TRAIN``, ``PREPARE``), so a value means the same thing everywhere."""

    name: str
    title: str

    def __call__(self, default: Any, help: str, defines_run: str = "") -> Any:
        """A field of this section with its documentation (shown by ``--help`` and in .env.example).

        ``defines_run`` marks the settings that define what a checkpoint was trained on ("any", or the
        dataset they belong to): a run does not resume from a checkpoint with other values of them.
        """
        return field(default=default, metadata={"help": help, "section": self.name, "defines_run": defines_run})


PRESET = Section("preset", "where the other values start from")
RUN = Section("run", "run and output")
ENCODER = Section("encoder", "encoder and tokenizer")
MODEL = Section("model", "model")
WINDOWS = Section("windows", "windows (with the tokenizer, what the NQ feature cache's fingerprint covers)")
DATA = Section("data", "training data")
NQ_FILES = Section("nq_files", "Natural Questions files and featurisation")
OPTIMISATION = Section("optimisation", "optimisation")
EVALUATION = Section("evaluation", "evaluation and decoding")
DISTRIBUTED = Section("distributed", "distributed")
CHECKPOINTS = Section("checkpoints", "checkpoints")
LOGGING = Section("logging", "logging")
CONSOLE = Section("console", "console")


@dataclass
class Config:
    """Everything a training run needs to know; see the module docstring for where values come from."""

    # --- where the other values start from ---------------------------------------------------------
    preset: str = PRESET(
        DEFAULT_PRESET, "Preset file configs/NAME.toml (or a path to a .toml) applied over the "
        "defaults; 'none' for the bare defaults. Set with --preset or DISTQA_PRESET only.")

    # --- run and output ----------------------------------------------------------------------------
    run_name: str = RUN(
        "local", "Name of the run directory under output_dir. Restarts with the same name resume "
        "from its checkpoints (--resume auto); all nodes of a run must use the same name.")
    output_dir: str = RUN(
        "results", "Directory holding run directories. Must be shared storage when nodes resume.")
    seed: int = RUN(1234, "Seed for model initialisation, data order and dropout.")

    # --- encoder and tokenizer ---------------------------------------------------------------------
    model_name_or_path: str = ENCODER(
        str(TINY_MODEL_DIR.relative_to(REPO_ROOT)),
        "transformers encoder: a local directory or a hub name such as bert-base-uncased "
        "(hub names need network on first use). Relative paths are relative to the repository.", defines_run="any")
    tokenizer_name_or_path: str = ENCODER(
        "", "Tokenizer directory or hub name; empty means the same as model_name_or_path.")

    # --- model -------------------------------------------------------------------------------------
    from_scratch: bool = MODEL(
        True, "Initialise the encoder randomly from the model's config instead of loading its "
        "weights (the offline tiny model has no weights).")
    dropout: float | None = MODEL(
        None, "Override the encoder's hidden and attention dropout (0 <= p < 1); none keeps the "
        "model's own.")
    attn_implementation: Literal["sdpa", "eager"] = MODEL(
        "sdpa", "The encoder's attention kernel: 'sdpa' is torch's scaled_dot_product_attention (FlashAttention "
        "or cuDNN kernels on GPUs, no seq × seq matrix in memory); 'eager' the reference matmul-softmax-matmul.")

    # --- windows (with the tokenizer, what the NQ feature cache's fingerprint covers) --------------
    max_seq_len: int = WINDOWS(128, "Tokens per window: [CLS] question [SEP] document [SEP] + pad.", defines_run="any")
    max_question_len: int = WINDOWS(32, "Most question tokens kept in a window.", defines_run="any")
    doc_stride: int = WINDOWS(
        64, "Document wordpieces between the starts of consecutive windows of one document; at most "
        "max_seq_len - max_question_len - 3.", defines_run="nq")
    negative_keep_rate: float = WINDOWS(
        0.1, "Fraction of training windows without an answer that are kept (0..1, deterministic by "
        "nq_seed); 1 keeps every window. Validation always keeps every window.", defines_run="nq")
    validation_fraction: float = WINDOWS(
        0.1, "Fraction of NQ examples held out for validation, by example and per answer type.", defines_run="nq")
    nq_seed: int = WINDOWS(
        0, "Seed of the validation split and the negative-window sampling; apart from seed, so that a "
        "new training seed reuses the cache.", defines_run="nq")

    # --- training data -----------------------------------------------------------------------------
    dataset: Literal["dummy", "nq"] = DATA(
        "dummy", "Training data: 'dummy' is the offline synthetic DummyDataset; 'nq' the Natural Questions "
        "features of nq_train_file, built once by `python -m distqa.prepare`.", defines_run="any")
    dummy_size: int = DATA(4096, "Number of examples in the DummyDataset.", defines_run="dummy")
    num_workers: int = DATA(0, "DataLoader worker processes per rank (0 = load in the trainer).")
    trim_padding: bool = DATA(
        True, "Pad each batch only to its longest window (rounded up to a multiple of 8), not to "
        "max_seq_len: the model skips the padding of batches of short windows. Off only for fixed shapes in "
        "training (evaluation and predict always trim).")

    # --- Natural Questions files and featurisation -------------------------------------------------
    nq_train_file: str = NQ_FILES(
        "data/nq-sample/simplified-nq-train.jsonl", "Natural Questions train file in the Kaggle "
        "'simplified' jsonl format; the committed synthetic sample by default (data/README.md).", defines_run="nq")
    nq_cache_dir: str = NQ_FILES(
        "data/nq-cache", "Where NQ feature caches live, one subdirectory per fingerprint of input "
        "file + tokenizer + window settings (not part of it). Shared storage on multi-node runs.")
    on_bad_line: Literal["skip", "fail"] = NQ_FILES(
        "skip", "A malformed NQ line is skipped and counted (reported at the end), or fails at once. "
        "Not part of the fingerprint.")
    max_bad_line_fraction: float = NQ_FILES(
        0.01, "Refuse an NQ file with more than this fraction of malformed lines. Not part of the "
        "fingerprint.")
    num_proc: int = NQ_FILES(
        0, "Processes that featurise NQ (prepare, or a single-process train that finds no cache); "
        "0 = one per CPU core (one per 16 MB for smaller files). Not part of the fingerprint.")

    # --- optimisation ------------------------------------------------------------------------------
    global_batch_size: int = OPTIMISATION(
        32, "Examples per optimizer step over all ranks; must equal per_rank_batch_size × "
        "world_size × accumulation steps (the accumulation is derived from it).")
    per_rank_batch_size: int = OPTIMISATION(8, "Examples per forward pass on one rank (micro-batch).")
    grow_global_batch: bool = OPTIMISATION(
        False, "When per_rank_batch_size × world_size exceeds global_batch_size, grow the global batch to one "
        "micro-batch per rank instead of refusing the run, scale lr by the square root of the growth and "
        "keep the warm-up's examples (fewer steps). With it a preset runs unchanged on 1 to 64 GPUs.")
    lr: float = OPTIMISATION(5e-4, "Peak AdamW learning rate, reached at the end of the warm-up.")
    weight_decay: float = OPTIMISATION(0.01, "AdamW weight decay; biases and LayerNorm are never decayed.")
    warmup_steps: int = OPTIMISATION(10, "Optimizer steps of linear warm-up from 0 to lr.")
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

    # --- evaluation and decoding -------------------------------------------------------------------
    eval_every: int = EVALUATION(
        0, "Evaluate on the NQ validation split every N optimizer steps, and always at the end "
        "(0 = at the end only). All ranks share the work; the DummyDataset has no validation split.")
    eval_batch_size: int = EVALUATION(64, "Windows per forward pass on one rank in evaluation and predict.")
    max_answer_len: int = EVALUATION(30, "Longest answer span the decoder considers, in wordpieces.")
    long_threshold: float | None = EVALUATION(
        None, "Give a long answer when its score (best span minus the [CLS] null score) exceeds this; "
        "none = tuned for micro-F1 on the validation split at every evaluation (stored in checkpoints).")
    short_threshold: float | None = EVALUATION(
        None, "The same for the short answer (span, YES or NO); none = tuned like long_threshold.")

    # --- distributed -------------------------------------------------------------------------------
    device: Literal["auto", "cuda", "cpu"] = DISTRIBUTED(
        "auto", "auto = CUDA + NCCL when GPUs are present, else CPU + gloo. LOCAL_RANK picks the GPU.")
    dist_timeout_s: int = DISTRIBUTED(
        600, "Seconds a collective may wait for the other ranks before the run fails.")
    ddp_bucket_cap_mb: int = DISTRIBUTED(
        25, "Size of DDP's gradient buckets in MB: each is all-reduced as soon as backward has filled it, "
        "overlapping communication with the rest of the backward.")
    ddp_comm_hook: Literal["none", "bf16"] = DISTRIBUTED(
        "none", "Gradient compression for the all-reduce: 'bf16' sends gradients as bf16 (half the bytes; "
        "for slow networks between nodes, docs/PERFORMANCE.md), 'none' sends them as they are.")

    # --- checkpoints -------------------------------------------------------------------------------
    resume: str = CHECKPOINTS(
        "auto", "'auto' continues from the newest checkpoint of this run if one exists, 'none' "
        "starts fresh, or a path to a checkpoint file.")
    checkpoint_every: int = CHECKPOINTS(50, "Save a checkpoint every N optimizer steps (0 = only at the end).")
    keep_checkpoints: int = CHECKPOINTS(3, "Newest step checkpoints kept in the run directory.")
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
        "looked up by GPU name (H100, H200, A100, L4, A10G, V100: distqa.throughput), no MFU on CPUs and "
        "unknown GPUs.")
    tensorboard: bool = LOGGING(True, "Write TensorBoard scalars to <run dir>/tensorboard (rank 0).")

    # --- console -----------------------------------------------------------------------------------
    progress_bar: bool = CONSOLE(True, "Show a tqdm progress bar on rank 0.")

    def __post_init__(self) -> None:
        positive = ("max_seq_len", "max_question_len", "dummy_size", "global_batch_size",
                    "per_rank_batch_size", "epochs", "dist_timeout_s", "ddp_bucket_cap_mb", "keep_checkpoints",
                    "log_every", "eval_batch_size", "max_answer_len", "stop_check_every")
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
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"peak_tflops must be > 0 or none, got {self.peak_tflops}.")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1) or none, got {self.dropout}.")
        try:  # the stride only matters to NQ; prepare checks it whatever the dataset (WindowSettings)
            check_window_shape(self.max_seq_len, self.max_question_len,
                               self.doc_stride if self.dataset == "nq" else None)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        for name in ("negative_keep_rate", "max_bad_line_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be between 0 and 1, got {getattr(self, name)}.")
        if not 0 <= self.validation_fraction < 1:
            raise ConfigError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}.")
        if self.per_rank_batch_size > self.global_batch_size:
            raise ConfigError(
                f"per_rank_batch_size ({self.per_rank_batch_size}) is larger than global_batch_size "
                f"({self.global_batch_size}); lower it or raise global_batch_size.")
        if not self.run_name or "/" in self.run_name or self.run_name in (".", ".."):
            raise ConfigError(f"run_name must be a plain directory name, got {self.run_name!r}.")

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
        return resolve_path(self.nq_train_file)

    @property
    def nq_cache_path(self) -> Path:
        return resolve_path(self.nq_cache_dir)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def for_world_size(self, world_size: int) -> Config:
        """This config as it runs on ``world_size`` ranks: itself, unless ``grow_global_batch`` is set and
        ``per_rank_batch_size × world_size`` does not divide ``global_batch_size``. Then the global batch
        becomes the next multiple of it, the learning rate grows by the square root of the growth (the
        square-root rule for Adam-type optimizers, which keeps the noise of a step's update about the same)
        and the warm-up covers the same number of examples in fewer steps (README "Presets and scaling")."""
        per_micro_step = self.per_rank_batch_size * world_size
        if not self.grow_global_batch or self.global_batch_size % per_micro_step == 0:
            return self
        grown = -(-self.global_batch_size // per_micro_step) * per_micro_step
        growth = grown / self.global_batch_size
        return dataclasses.replace(self, global_batch_size=grown, lr=self.lr * math.sqrt(growth),
                                   warmup_steps=math.ceil(self.warmup_steps / growth))

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
                f"{alternative}, or --grow-global-batch true to let it grow.")
        return self.global_batch_size // per_micro_step

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_defining(self) -> tuple[str, ...]:
        """The settings a checkpoint must share with this config to be resumed (``defines_run`` fields)."""
        return tuple(f.name for f in dataclasses.fields(self) if f.metadata["defines_run"] in ("any", self.dataset))


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
"""Every setting by name, in the order of the sections."""
SECTIONS = (PRESET, RUN, ENCODER, MODEL, WINDOWS, DATA, NQ_FILES, OPTIMISATION, EVALUATION, DISTRIBUTED, CHECKPOINTS,
            LOGGING, CONSOLE)


def resolve_path(name: str) -> Path:
    """Relative paths work from the current directory and, as the defaults need, from the repository."""
    path = Path(name).expanduser()
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path


def _local_or_hub(name: str) -> str:
    path = resolve_path(name)
    return str(path) if path.exists() else name
