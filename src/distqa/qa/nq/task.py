"""The ``nq`` task: Natural Questions (the Kaggle 'simplified' jsonl), featurised once into a feature cache
(``python -m distqa.prepare --task nq``), scored by the Kaggle micro-F1 on a validation split held out by
example; the decoding thresholds tuned at each evaluation are its inference state (``predict`` uses them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distqa.config import CONSOLE
from distqa.distributed.runtime import Runtime
from distqa.encoders.config import ENCODER
from distqa.qa.config import WINDOWS
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.config import NQ_FILES, NQConfig
from distqa.qa.nq.prepared import find_features, prepare_nq
from distqa.qa.task import CachedQATask, qa_commands

if TYPE_CHECKING:  # the model side, imported where evaluation starts (distqa.qa.task's docstring)
    from distqa.qa.nq.inference import Evaluator


class NQTask(CachedQATask):
    name = "nq"
    config_class = NQConfig
    prepare_sections = (ENCODER, WINDOWS, NQ_FILES, CONSOLE)
    commands = qa_commands("distqa.qa.nq.commands")
    config: NQConfig
    data_name, cache_setting, units = "NQ", "nq_cache_dir", "examples"
    no_validation = ("no evaluation: the validation split of {directory} is empty (too few examples for "
                     "validation_fraction {fraction})")
    prepare_features, find_features = staticmethod(prepare_nq), staticmethod(find_features)
    windows_class = NQWindows

    def evaluator(self, runtime: Runtime) -> Evaluator | None:
        if self.config.validation_fraction == 0:
            self.log.warning("no evaluation: validation_fraction is 0, so there is no validation split and no "
                             "best.pt")
            return None
        return super().evaluator(runtime)

    def validation_evaluator(self, directory: Path, runtime: Runtime) -> Evaluator:
        from distqa.qa.nq.inference import Evaluator  # the model side: imported where evaluation starts

        config = self.config
        return Evaluator(directory, runtime, config.eval_batch_size, config.max_answer_len, config.long_threshold,
                         config.short_threshold)
