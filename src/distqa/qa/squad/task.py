"""The ``squad`` task: any data in the SQuAD schema (SQuAD v1.1/v2.0 JSON, the Hugging Face squad schema as JSON
Lines or Parquet, a Hugging Face dataset), featurised once into a cache (``python -m distqa.prepare --task squad``),
scored by the official SQuAD v2.0 exact match and F1 on a validation file or on contexts held out of the training
file; the tuned no-answer threshold is its inference state (``predict`` uses it). docs/SQUAD.md shows it end to end."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from torch.utils.data import Dataset

from distqa.config import CONSOLE
from distqa.config.errors import DataError
from distqa.distributed.runtime import Runtime
from distqa.encoders.config import ENCODER
from distqa.qa.config import WINDOWS
from distqa.qa.squad.cache import SquadWindows
from distqa.qa.squad.config import SQUAD_FILES, SquadConfig
from distqa.qa.squad.prepared import find_squad_features, prepare_squad, require_squad_features
from distqa.qa.task import QATask, qa_commands

if TYPE_CHECKING:  # the model side, imported where evaluation starts (distqa.qa.task's docstring)
    from distqa.qa.squad.inference import SquadEvaluator

log = logging.getLogger(__name__)


class SquadTask(QATask):
    name = "squad"
    config_class = SquadConfig
    prepare_sections = (ENCODER, WINDOWS, SQUAD_FILES, CONSOLE)
    commands = qa_commands("distqa.qa.squad.commands")
    config: SquadConfig

    def check_inputs(self, may_build: bool) -> None:
        """The sources load, and the feature cache exists: built here by a single process that finds none; a
        multi-process run (or the doctor) needs it built before launch, as NQ's."""
        super().check_inputs(may_build)
        try:
            require_squad_features(self.config, self.tokenizer, build=may_build)
        except DataError as err:
            raise DataError(f"feature cache: {err}") from None

    def build_data(self) -> Path:
        try:
            return prepare_squad(self.config, self.tokenizer)
        except OSError as err:  # not writable, a full disk: name the setting that chose the folder
            raise OSError(err.errno, f"{err.strerror} (check squad_cache_dir)", err.filename) from None

    def train_dataset(self) -> Dataset:
        directory = find_squad_features(self.config, self.tokenizer)
        windows = SquadWindows(directory, "train")
        log.info("training on %d SQuAD windows from %s", len(windows), directory)
        return windows

    def evaluator(self, runtime: Runtime) -> SquadEvaluator | None:
        """The validation split of the feature cache; none when it is empty."""
        config = self.config
        directory = find_squad_features(config, self.tokenizer)
        if not (directory / "validation").is_dir():
            log.warning("no evaluation and no best.pt: no squad_validation_file, and validation_fraction %s holds out "
                        "no question", config.validation_fraction)
            return None
        from distqa.qa.squad.inference import SquadEvaluator  # the model side: imported where evaluation starts

        evaluator = SquadEvaluator(directory, runtime, config.eval_batch_size, config.max_answer_len,
                                   config.no_answer_threshold)
        every = f"{config.eval_every} steps and at the end" if config.eval_every else "run's end"
        log.info("evaluating on %d validation questions (%d windows) every %s", len(evaluator),
                 len(evaluator.windows), every)
        return evaluator
