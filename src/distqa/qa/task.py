"""What the built-in question-answering tasks share: a ``transformers`` encoder with the span and answer-type
heads (:mod:`distqa.qa.model`), its tokenizer and its pair format (:class:`~distqa.encoders.template.PairTemplate`), and
batches of windows cut to their longest window.

The model's module is imported where a model is built, not with the task: it brings transformers' modeling code
and torch's compiler (:mod:`distqa.encoders.varlen` imports ``torch._dynamo``), seconds of imports that
``python -m distqa.prepare`` (run by the local launcher before every run) and the featurising processes do not
need."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate
from transformers import PreTrainedTokenizerBase

from distqa.config import ConfigError
from distqa.config.errors import DataError
from distqa.distributed.runtime import Runtime, broadcast_object
from distqa.encoders.flops import model_flops_per_token
from distqa.encoders.memory import EncoderMemory, count_on_meta
from distqa.encoders.pretrained import check_sources, fetch_once, load_tokenizer
from distqa.encoders.template import PairTemplate
from distqa.qa.collate import INPUT_NAMES, collate_trimmed
from distqa.qa.config import QAConfig
from distqa.qa.feature_store import BEFORE_LAUNCH
from distqa.tasks.base import Batch, Evaluator, Task

if TYPE_CHECKING:
    from distqa.qa.model import QAOutput


class QATask(Task):
    """Extractive QA over windows in the tokenizer's pair format, ``[CLS] question [SEP] document [SEP]`` for BERT
    (subclasses bring the data)."""

    config_class = QAConfig
    input_names = INPUT_NAMES
    # The encoders' buffers (position and token type ids, ModernBERT's rotary frequencies) are constants, outside
    # the state dict (tests/unit/test_fork_traps.py checks every family): nothing to broadcast at each forward.
    sync_buffers = False
    # Export is the same for every QA task; each subclass adds its own predict, evaluate and score (qa_commands).
    commands: ClassVar[Mapping[str, str]] = {"export": "distqa.qa.commands.export:main"}
    config: QAConfig

    def __init__(self, config: QAConfig) -> None:
        super().__init__(config)
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def check_inputs(self, may_build: bool) -> None:
        """The encoder config, the weights (unless from_scratch) and a local tokenizer load, and the tokenizer's
        pair format leaves the windows room for the document (one ConfigError naming the path or setting and the
        fix otherwise); hub names are checked when :meth:`setup` loads them."""
        self._tokenizer = check_sources(self.config)
        if self._tokenizer is not None:
            self.window_template()

    def window_template(self) -> PairTemplate:
        """The tokenizer's pair format, checked against the window settings (RoBERTa's takes 4 special tokens)."""
        config, tokenizer = self.config, self.tokenizer
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"tokenizer {config.tokenizer_source} is not a fast tokenizer (a tokenizer.json, or one "
                              "transformers converts): windows need its post-processor.")
        try:
            template = PairTemplate.of(tokenizer.backend_tokenizer)
            template.check_shape(config.max_seq_len, config.max_question_len, getattr(config, "doc_stride", None))
        except ValueError as err:
            raise ConfigError(f"the windows of tokenizer {config.tokenizer_source}: {err}") from None
        return template

    def setup(self, runtime: Runtime) -> None:
        """Hub sources put into the hub cache once, by global rank 0, while the others wait (or one line on every
        rank where rank 0 cannot); then the tokenizer."""
        fetch_once(self.config, runtime.rank, broadcast_object)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """Loaded once: by :meth:`check_inputs` when local, else here (after :meth:`setup` for a hub name)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config)
        return self._tokenizer

    def collate(self, examples: Sequence[Mapping[str, Any]]) -> Batch:
        return collate_trimmed(examples) if self.config.trim_padding else default_collate(examples)

    def build_model(self) -> nn.Module:
        from distqa.qa.model import build_model  # here, not at the top: see the module's docstring

        return build_model(self.config)

    def loss(self, output: QAOutput, batch: Batch) -> torch.Tensor:
        from distqa.qa.model import qa_loss  # imported by build_model already: a lookup in sys.modules

        return qa_loss(output, batch)

    def sharding_units(self, model: nn.Module) -> list[nn.Module]:
        from distqa.qa.model import transformer_layers  # the model side, lazily: see the module's docstring

        return transformer_layers(model)

    def flops_per_token(self, model: nn.Module, seq_len: int) -> float | None:
        return model_flops_per_token(model.encoder, seq_len)

    def training_memory(self) -> EncoderMemory:
        """The model of these settings counted on the meta device: from its config alone, no weights loaded."""
        from distqa.qa.model import build_model  # the model side, lazily: see the module's docstring

        model = count_on_meta(lambda: build_model(dataclasses.replace(self.config, from_scratch=True)))
        return EncoderMemory.of_model(model, model.encoder.config, self.config.max_seq_len,
                                       self.config.attn_implementation)


class CachedQATask(QATask):
    """A QA task whose windows come from a feature cache built once (``python -m distqa.prepare``), with a training
    and a validation split: NQ's and SQuAD's. A subclass names its cache's functions (``config, tokenizer`` first),
    its windows and its evaluator; its module's logger writes the lines."""

    data_name: ClassVar[str]
    """The data in log lines: ``NQ``, ``SQuAD``."""
    cache_setting: ClassVar[str]
    """The setting that chooses the cache's folder, named when it cannot be written."""
    units: ClassVar[str]
    """What the evaluator counts: ``examples``, ``questions``."""
    no_validation: ClassVar[str]
    """The warning when the validation split is empty (``{directory}``, ``{fraction}``: validation_fraction)."""
    prepare_features: ClassVar[Callable[..., Path]]
    find_features: ClassVar[Callable[..., Path]]
    windows_class: ClassVar[Callable[[Path, str], Dataset]]

    def check_inputs(self, may_build: bool) -> None:
        """The sources load, and the feature cache exists: built here by a single process that finds none;
        a multi-process run (or the doctor) needs it built before launch, since the other ranks would wait
        in a collective while one featurises."""
        super().check_inputs(may_build)
        try:
            try:
                self.find_features(self.config, self.tokenizer, hint=BEFORE_LAUNCH)
            except DataError:
                if not may_build:
                    raise
                self.prepare_features(self.config, self.tokenizer)
        except DataError as err:
            raise DataError(f"feature cache: {err}") from None

    def build_data(self) -> Path:
        try:
            return self.prepare_features(self.config, self.tokenizer)
        except OSError as err:  # not writable, a full disk: name the setting that chose the folder
            raise OSError(err.errno, f"{err.strerror} (check {self.cache_setting})", err.filename) from None

    def train_dataset(self) -> Dataset:
        directory = self.find_features(self.config, self.tokenizer)
        windows = self.windows_class(directory, "train")
        self.log.info("training on %d %s windows from %s", len(windows), self.data_name, directory)
        return windows

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        """The validation split of the feature cache; none when it is empty."""
        config = self.config
        directory = self.find_features(config, self.tokenizer)
        if not (directory / "validation").is_dir():
            self.log.warning(self.no_validation.format(directory=directory, fraction=config.validation_fraction))
            return None
        evaluator = self.validation_evaluator(directory, runtime)
        every = f"{config.eval_every} steps and at the end" if config.eval_every else "run's end"
        self.log.info("evaluating on %d validation %s (%d windows) every %s", len(evaluator), self.units,
                      len(evaluator.windows), every)
        return evaluator

    def validation_evaluator(self, directory: Path, runtime: Runtime) -> Any:
        """The evaluator of the validation split in ``directory`` (it has ``windows`` and a length)."""
        raise NotImplementedError

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)


def qa_commands(module: str) -> dict[str, str]:
    """The commands of a QA task whose predict, evaluate and score are the functions of those names in ``module``
    (:mod:`distqa.qa.nq.commands`, :mod:`distqa.qa.squad.commands`), with the export every QA task shares."""
    return {**QATask.commands, **{name: f"{module}:{name}" for name in ("predict", "evaluate", "score")}}
