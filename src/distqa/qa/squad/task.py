"""The ``squad`` task: any data in the SQuAD schema (SQuAD v1.1/v2.0 JSON, the Hugging Face squad schema as JSON
Lines or Parquet, a Hugging Face dataset), featurised once into a cache (``python -m distqa.prepare --task squad``),
scored by the official SQuAD v2.0 exact match and F1 on a validation file or on contexts held out of the training
file; the tuned no-answer threshold is its inference state (``predict`` uses it). docs/SQUAD.md shows it end to end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from distqa.config import CONSOLE
from distqa.distributed.runtime import Runtime
from distqa.encoders.config import ENCODER
from distqa.qa.config import WINDOWS
from distqa.qa.squad.cache import SquadWindows
from distqa.qa.squad.config import SQUAD_FILES, SquadConfig
from distqa.qa.squad.prepared import find_squad_features, prepare_squad
from distqa.qa.task import CachedQATask, qa_commands

if TYPE_CHECKING:  # the model side, imported where evaluation starts (distqa.qa.task's docstring)
    from distqa.qa.squad.inference import SquadEvaluator


class SquadTask(CachedQATask):
    name = "squad"
    config_class = SquadConfig
    prepare_sections = (ENCODER, WINDOWS, SQUAD_FILES, CONSOLE)
    commands = qa_commands("distqa.qa.squad.commands")
    config: SquadConfig
    data_name, cache_setting, units = "SQuAD", "squad_cache_dir", "questions"
    no_validation = ("no evaluation and no best.pt: no squad_validation_file, and validation_fraction {fraction} "
                     "holds out no question")
    prepare_features, find_features = staticmethod(prepare_squad), staticmethod(find_squad_features)
    windows_class = SquadWindows

    def validation_evaluator(self, directory: Path, runtime: Runtime) -> SquadEvaluator:
        from distqa.qa.squad.inference import SquadEvaluator  # the model side: imported where evaluation starts

        config = self.config
        return SquadEvaluator(directory, runtime, config.eval_batch_size, config.max_answer_len,
                              config.no_answer_threshold)
