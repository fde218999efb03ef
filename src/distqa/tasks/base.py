"""The task seam: what a run trains on and how it is scored. A fork implements one class, and nothing else.

The trainer, the checkpoints, the doctor, the preflight and the launchers know only this interface; the
registered tasks (``dummy`` and the rest) go through it like a fork's own. A task brings its settings
(``config_class``, a dataclass that extends :class:`~distqa.config.Config` with fields made by a
:class:`~distqa.config.Section`), its data, its model and loss, its evaluation (an :class:`Evaluator`) and, where it
has them, its FLOPs, its memory estimate and its commands: each member of :class:`Task` below says what the trainer
does with it, and docs/FORKING.md lists them in one table beside the example's. Its inference state
(:attr:`Evaluation.state`: a QA task's tuned decoding thresholds) is saved in every checkpoint as it is and handed
back on resume; the trainer never looks inside.

What a task gets for free: DDP with the same global batch on any world size, exact resume, graceful stops
and restarts, the preflight checks and the doctor, every launcher (docs/FORKING.md). A task is chosen with
``--task NAME`` (registered in :data:`distqa.tasks.REGISTERED`) or ``--task package.module:ClassName``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from distqa.config import Config, Section
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime

if TYPE_CHECKING:
    from distqa.tasks.step_memory import TrainingMemory

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class BestMetric:
    """The metric that picks ``best.pt``, and whether higher or lower is better."""

    name: str
    mode: Literal["max", "min"] = "max"

    def improves(self, value: float, best: float | None, min_delta: float = 0.0) -> bool:
        """Whether ``value`` beats ``best`` by more than ``min_delta`` (None: nothing to beat yet)."""
        if best is None:
            return True
        return value > best + min_delta if self.mode == "max" else value < best - min_delta


@dataclass(kw_only=True)
class Evaluation:
    """What one evaluation gives, the same on every rank."""

    metrics: Mapping[str, float]
    """Named numbers: each goes to the log and to TensorBoard as ``eval/<name>``."""
    state: dict[str, Any] | None = None
    """What inference needs besides the weights (plain Python values and tensors); saved in the checkpoints."""
    summary: str = ""
    """One log line; empty: the metrics, name by name."""

    def describe(self) -> str:
        return self.summary or ", ".join(f"{name} {value:.4g}" for name, value in self.metrics.items())


class Evaluator(Protocol):
    """Scores a model on the task's validation data. Every rank calls :meth:`evaluate` together (the ranks
    share the work) and gets the same :class:`Evaluation`."""

    best_metric: BestMetric

    def evaluate(self, model: nn.Module, precision: Precision) -> Evaluation: ...


class Task:
    """Subclass it; see the module docstring. ``self.config`` is an instance of ``config_class``."""

    name: ClassVar[str] = ""
    """Short name, used in logs and in ``defines_run`` marks that name tasks."""
    config_class: ClassVar[type[Config]] = Config
    """The task's settings: Config plus its own fields."""
    input_names: ClassVar[tuple[str, ...]] = ()
    """The batch columns the model reads: the trainer calls ``model(**{name: batch[name]})``."""
    prepare_sections: ClassVar[Sequence[Section]] = ()
    """The settings sections ``python -m distqa.prepare`` shows as flags for this task (with the preset and task);
    none: only ``--preset`` and ``--task`` (a preset, ``.env`` and ``DISTQA_*`` still set every setting). Only
    what prepare shows: whether there is anything to build is :meth:`build_data`'s answer."""
    sync_buffers: ClassVar[bool] = True
    """Whether every rank holds rank 0's model buffers (BatchNorm's running statistics): DDP broadcasts them before
    each training forward (torch's default, ``forward_sync_buffers``) and the trainer before each evaluation, so
    all ranks evaluate, and the checkpoints hold, one model. False only when the buffers never change in training
    (the QA encoders' position ids): it saves a broadcast per forward. A sharded run (``data_parallel = fsdp |
    hsdp``) broadcasts them before each evaluation only."""
    commands: ClassVar[Mapping[str, str]] = {}
    """The commands that read this task's checkpoints or answers (``predict``, ``evaluate``, ``score``, ``export``):
    name -> ``package.module:function``, called with the command line as ``function(argv) -> exit status`` by
    ``python -m distqa.<name>`` once it found the task (:mod:`distqa.tasks.commands`); only that module is
    imported. A command the task leaves out says so in one line."""

    def __init__(self, config: Config) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"task {self.name!r} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    # --- before any process group exists --------------------------------------------------------
    def check_inputs(self, may_build: bool) -> None:
        """Raise ConfigError (or DataError) with the fix when this run could not read what it needs: a model
        that does not load, a missing cache. Runs on every rank before any process group exists, and in the
        doctor. ``may_build``: the run is a single process, so it may build a missing cache itself
        (:meth:`build_data`; nobody waits); False: a multi-process run or the doctor, which only check."""

    def build_data(self) -> Path | None:
        """Build what the task reads once, before training (``python -m distqa.prepare``, which the launchers run
        with ``--only-if-needed`` before any rank starts): a feature cache. Returns where it is; None when the task
        has nothing to build. An OSError (a folder not writable, a full disk) should name the folder and the setting
        that chose it."""
        return None

    # --- inside the process group, on every rank --------------------------------------------------
    def setup(self, runtime: Runtime) -> None:
        """Collective set-up before the data and the model are built (an encoder task's: hub files downloaded once, by
        rank 0, while the others wait)."""

    def train_dataset(self) -> Dataset:
        raise NotImplementedError(f"task {self.name!r} must define train_dataset()")

    def collate(self, examples: Sequence[Mapping[str, Any]]) -> Batch:
        """Examples of the dataset into one micro-batch (default: stacked by ``default_collate``)."""
        return default_collate(examples)

    def build_model(self) -> nn.Module:
        """The model, randomly initialised or from pretrained weights; the same on every rank (the seed is set)."""
        raise NotImplementedError(f"task {self.name!r} must define build_model()")

    def loss(self, output: Any, batch: Batch) -> torch.Tensor:
        """The scalar training loss of one micro-batch: ``output`` is what the model returned. It must be the
        **mean** over the rows (examples) it is given: the trainer weighs it by their part of the global batch.

        When the world size does not split the global batch evenly, a rank's short share is padded with copies of
        its own examples so that every micro-batch keeps its shape (``distqa.distributed.sampler``); the model runs
        on all rows, and then this method is called with every tensor of ``output`` and ``batch`` whose first
        dimension is the micro-batch size cut to the real rows (an output of tensors in dicts, lists, tuples or a
        registered pytree; ``distqa.training.step_plan.real_rows_of``). A model that mixes rows in its forward
        (BatchNorm in training mode) sees the copies too."""
        raise NotImplementedError(f"task {self.name!r} must define loss()")

    def sharding_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules that ``data_parallel = fsdp | hsdp`` shards one by one (:mod:`distqa.distributed.fsdp`): each
        one's weights are gathered just before its forward and backward and freed after, so the largest unit
        sets the peak, and each is one compiled region. Default: the blocks of the model's largest
        ``nn.ModuleList`` (a transformer's layers, wherever they sit), else its direct children that hold
        parameters (:func:`default_sharding_units`); what no unit holds belongs to the root (the model), gathered for
        the whole step."""
        return default_sharding_units(model)

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        """The evaluation of this run; None: no evaluation, no ``best.pt`` (say why in the log)."""
        log.warning("no evaluation and no best.pt: task %r defines no evaluator", self.name)
        return None

    def flops_per_token(self, model: nn.Module, seq_len: int) -> float | None:
        """Training FLOPs (forward and backward) per token at ``seq_len``, for the MFU in the logs; None: no MFU."""
        return None

    def training_memory(self) -> TrainingMemory | None:
        """How a training step's memory depends on its settings, for the doctor's memory check (a
        :class:`distqa.tasks.step_memory.TrainingMemory`: the estimate for a step and what it assumed). A transformers
        encoder's task returns ``EncoderMemory.of_model`` (``encoders/memory.py``) of its model built by
        ``count_on_meta`` (no weights loaded). None: the doctor prints no estimate."""
        return None


def default_sharding_units(model: nn.Module) -> list[nn.Module]:
    """The blocks that hold parameters of the model's largest ``nn.ModuleList`` (BERT's ``encoder.layer``,
    DistilBERT's ``transformer.layer``, ModernBERT's ``layers``), else its direct children that hold parameters."""
    lists = [module for module in model.modules() if isinstance(module, nn.ModuleList)]
    largest = max(lists, key=_parameter_count, default=None)
    if largest is not None and _parameter_count(largest) > 0:
        return [block for block in largest if _parameter_count(block) > 0]
    return [child for child in model.children() if _parameter_count(child) > 0]


def _parameter_count(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())
