"""Answer every question of an NQ jsonl file with a trained checkpoint: a Kaggle submission CSV.

The sample test file, on one process (CPU or one GPU)::

    python -m distqa.predict --checkpoint results/nq-sample/checkpoints/best.pt \\
        --input data/nq-sample/simplified-nq-test.jsonl --output submission.csv

Over all GPUs of a node (each rank scores a share of the windows; rank 0 writes the file)::

    torchrun --standalone --nproc-per-node gpu -m distqa.predict --checkpoint … --input … --output …

Score it against a train-format file of the same examples::

    python -m distqa.score --gold data/nq-sample/simplified-nq-test-gold.jsonl --submission submission.csv

The input may be the test file (no annotations) or a train-format file (annotations are ignored).
It is featurised with the window settings and tokenizer the checkpoint was trained with, into the
feature cache (``--nq-cache-dir``; reused when the same file is predicted again). Every line must be
valid: a submission needs a row for every example. The decoding thresholds are the ones tuned on
the validation split and stored in the checkpoint, unless ``--long-threshold``/``--short-threshold``
say otherwise. The CSV has the header ``example_id,PredictionString`` and rows ``<id>_long`` and
``<id>_short`` in input order, with ``start:end``, ``YES``, ``NO`` or blank.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dotenv import load_dotenv

from distqa.config import ConfigError
from distqa.data.nq import require_file
from distqa.files import DataError, print_error
from distqa.flags import add_setting_flags, setting_overrides
from distqa.metric import write_submission
from distqa.tasks.configs import NQConfig

log = logging.getLogger("distqa.predict")

SETTINGS = ("long_threshold", "short_threshold", "eval_batch_size", "device", "nq_cache_dir", "num_proc")
"""The settings predict takes from its flags; the others come from the checkpoint."""


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="best.pt or a step-*.pt written by distqa.train, or a directory written by distqa.export")
    parser.add_argument("--input", required=True, type=Path, help="NQ jsonl: the test file or a train-format file")
    parser.add_argument("--output", required=True, type=Path, help="submission CSV to write (rank 0)")
    overrides = parser.add_argument_group(
        "settings (default: DISTQA_* variables, else the checkpoint's; the thresholds: its tuned ones)")
    add_setting_flags(overrides, SETTINGS, NQConfig, aliases={"eval_batch_size": "--batch-size"}, show_defaults=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Here, not at the top: featurising processes start with multiprocessing's spawn, which re-imports
    # this module, and should not import torch and transformers for nothing.
    from distqa.distributed import distributed_runtime, read_torchrun_env, setup_logging
    from distqa.inference import Predictor

    args = build_arg_parser().parse_args(argv)
    load_dotenv(".env", override=False)
    try:
        setup_logging(read_torchrun_env()["RANK"])
        require_file(args.input)
        overrides = setting_overrides(args, SETTINGS, NQConfig, os.environ)
        with distributed_runtime(overrides.pop("device", "auto")) as runtime:
            predictor = Predictor.from_checkpoint(args.checkpoint, runtime, overrides.pop("long_threshold", None),
                                                  overrides.pop("short_threshold", None), **overrides)
            answers = predictor.answers(predictor.predict_file(args.input))
            if runtime.is_main_process:
                write_submission(args.output, answers)
                log.info("wrote %s: %d examples, %d long and %d short answers", args.output, len(answers),
                         sum(bool(a.long) for a in answers.values()), sum(bool(a.short) for a in answers.values()))
    except (ConfigError, DataError) as err:
        print_error(f"distqa.predict: error: {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
