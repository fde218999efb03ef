"""The ``dummy`` task: the whole pipeline with no download, on the synthetic DummyDataset (no validation split)."""

from __future__ import annotations

import logging

from torch.utils.data import Dataset

from distqa.distributed import Runtime
from distqa.qa.config import DummyConfig
from distqa.qa.dummy_data import DummyDataset
from distqa.qa.task import QATask
from distqa.tasks.base import Evaluator

log = logging.getLogger(__name__)


class DummyTask(QATask):
    name = "dummy"
    config_class = DummyConfig
    config: DummyConfig

    def train_dataset(self) -> Dataset:
        config = self.config
        self.window_template()  # a hub tokenizer is checked here, once loaded
        return DummyDataset.for_tokenizer(self.tokenizer, size=config.dummy_size, max_seq_len=config.max_seq_len,
                                          max_question_len=config.max_question_len, seed=config.seed)

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        log.info("no evaluation: the dummy dataset has no validation split")
        return None
