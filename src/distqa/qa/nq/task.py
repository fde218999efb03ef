"""The ``nq`` task: Natural Questions (the Kaggle 'simplified' jsonl), featurised once into a feature cache
(``python -m distqa.prepare --task nq``), scored by the Kaggle micro-F1 on a validation split held out by
example; the decoding thresholds tuned at each evaluation are its inference state (``predict`` uses them)."""

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
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.config import NQ_FILES, NQConfig
from distqa.qa.nq.prepared import find_features, prepare_nq, require_nq_features
from distqa.qa.task import QATask, qa_commands

if TYPE_CHECKING:  # the model side, imported where evaluation starts (distqa.qa.task's docstring)
    from distqa.qa.nq.inference import Evaluator

log = logging.getLogger(__name__)


class NQTask(QATask):
    name = "nq"
    config_class = NQConfig
    prepare_sections = (ENCODER, WINDOWS, NQ_FILES, CONSOLE)
    commands = qa_commands("distqa.qa.nq.commands")
    config: NQConfig

    def check_inputs(self, may_build: bool) -> None:
        """The sources load, and the feature cache exists: built here by a single process that finds none;
        a multi-process run (or the doctor) needs it built before launch, since the other ranks would wait
        in a collective while one featurises."""
        super().check_inputs(may_build)
        try:
            require_nq_features(self.config, self.tokenizer, build=may_build)
        except DataError as err:
            raise DataError(f"feature cache: {err}") from None

    def build_data(self) -> Path:
        try:
            return prepare_nq(self.config, self.tokenizer, progress=self.config.progress_bar)
        except OSError as err:  # not writable, a full disk: name the setting that chose the folder
            raise OSError(err.errno, f"{err.strerror} (check nq_cache_dir)", err.filename) from None

    def train_dataset(self) -> Dataset:
        directory = find_features(self.config, self.tokenizer)
        windows = NQWindows(directory, "train")
        log.info("training on %d NQ windows from %s", len(windows), directory)
        return windows

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        """The validation split of the feature cache; none when the split is empty."""
        config = self.config
        if config.validation_fraction == 0:
            log.warning("no evaluation: validation_fraction is 0, so there is no validation split and no best.pt")
            return None
        directory = find_features(config, self.tokenizer)
        if not (directory / "validation").is_dir():
            log.warning("no evaluation: the validation split of %s is empty (too few examples for "
                        "validation_fraction %s)", directory, config.validation_fraction)
            return None
        from distqa.qa.nq.inference import Evaluator  # the model side: imported where evaluation starts

        evaluator = Evaluator(directory, runtime, config.eval_batch_size, config.max_answer_len,
                              config.long_threshold, config.short_threshold)
        every = f"{config.eval_every} steps and at the end" if config.eval_every else "run's end"
        log.info("evaluating on %d validation examples (%d windows) every %s", len(evaluator),
                 len(evaluator.windows), every)
        return evaluator
