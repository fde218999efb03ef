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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dotenv import load_dotenv

from distqa.config import FIELDS, Config, ConfigError
from distqa.data.nq import DataError, require_file

# torch, the model and the rest are imported in the functions that use them: featurising processes
# start with multiprocessing's spawn, which re-imports this module, and should start light.

log = logging.getLogger("distqa.predict")


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path,
                        help="best.pt or a step-*.pt written by distqa.train")
    parser.add_argument("--input", required=True, type=Path, help="NQ jsonl: the test file or a train-format file")
    parser.add_argument("--output", required=True, type=Path, help="submission CSV to write (rank 0)")
    parser.add_argument("--long-threshold", type=float, help="override the checkpoint's tuned long threshold")
    parser.add_argument("--short-threshold", type=float, help="override the checkpoint's tuned short threshold")
    parser.add_argument("--batch-size", type=int, help="windows per forward pass (default: eval_batch_size)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--nq-cache-dir", help="feature cache directory (default: the checkpoint's nq_cache_dir)")
    parser.add_argument("--num-proc", type=int, help="featurising processes (default: one per core)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from distqa.checkpoint import MODEL_STATE, load_checkpoint
    from distqa.distributed import distributed_runtime, is_main_process, read_torchrun_env, setup_logging
    from distqa.score import write_submission

    args = build_arg_parser().parse_args(argv)
    load_dotenv(".env", override=False)
    try:
        setup_logging(read_torchrun_env()["RANK"])
        require_file(args.input)
        try:
            state = load_checkpoint(args.checkpoint, required=MODEL_STATE)
        except FileNotFoundError:
            raise ConfigError(f"--checkpoint {args.checkpoint} does not exist") from None
        except ValueError as err:
            raise ConfigError(str(err)) from None
        config = inference_config(state["config"], args)
        with distributed_runtime(args.device, config.dist_timeout_s) as runtime:
            answers = predict(state, config, args, runtime)
            if is_main_process():
                write_submission(args.output, answers)
                log.info("wrote %s: %d examples, %d long and %d short answers", args.output, len(answers),
                         sum(bool(a.long) for a in answers.values()), sum(bool(a.short) for a in answers.values()))
    except (ConfigError, DataError) as err:
        print(f"distqa.predict: error: {err}", file=sys.stderr)
        return 2
    return 0


def inference_config(saved: dict[str, Any], args: argparse.Namespace) -> Config:
    """The training config of the checkpoint, made independent of the training data.

    Prediction needs the model, tokenizer and window settings, not the training file, which need
    not exist where predict runs: the dataset is set to "dummy" so that it is not looked for.
    """
    unknown = sorted(set(saved) - set(FIELDS))
    if unknown:
        log.warning("ignoring settings this version does not know: %s", ", ".join(unknown))
    values = {name: value for name, value in saved.items() if name in FIELDS}
    values |= {"dataset": "dummy", "resume": "none", "device": args.device}
    if args.nq_cache_dir:
        values["nq_cache_dir"] = args.nq_cache_dir
    if args.num_proc is not None:
        values["num_proc"] = args.num_proc
    if args.batch_size is not None:
        values["eval_batch_size"] = args.batch_size
    return Config(**values)


def predict(state: dict[str, Any], config: Config, args: argparse.Namespace, runtime: Any) -> dict[int, Any]:
    """The answers to every example of ``args.input``, computed over all ranks (the same on each)."""
    import torch
    from transformers import AutoTokenizer

    from distqa.data import nq_request, prepare_nq
    from distqa.data.cache import NQWindows, cached, open_examples
    from distqa.distributed import barrier, is_main_process
    from distqa.evaluate import ExampleColumns, Thresholds, WindowLayout, decode, score_windows
    from distqa.model import build_model
    from distqa.optim import Precision

    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_source)
    # Rank 0 featurises while the others wait (one writer per cache), then everyone opens the cache.
    if is_main_process():
        prepare_nq(config, tokenizer, source=args.input, labelled=False, on_bad_line="fail",
                   progress=config.progress_bar)
    barrier()
    directory = cached(nq_request(config, tokenizer, args.input, labelled=False), config.nq_cache_path)
    assert directory is not None, "rank 0 built the cache before the barrier"

    model = build_model(config_without_weights(config))
    model.load_state_dict(state["model"])
    model.to(runtime.device)
    decoding = state.get("decoding") or {}
    if not decoding and (args.long_threshold is None or args.short_threshold is None):
        log.warning("%s holds no tuned thresholds (no evaluation ran in its training); using 0 "
                    "(answer when a span beats [CLS]'s null score)", args.checkpoint)
    thresholds = Thresholds(
        args.long_threshold if args.long_threshold is not None else decoding.get("long_threshold", 0.0),
        args.short_threshold if args.short_threshold is not None else decoding.get("short_threshold", 0.0))
    max_answer_len = decoding.get("max_answer_len", config.max_answer_len)
    log.info("predicting %s with %s: thresholds long %.3f short %.3f, max answer length %d", args.input,
             args.checkpoint, thresholds.long, thresholds.short, max_answer_len)

    windows = NQWindows(directory, "test")
    precision = Precision.choose(config.precision, runtime.device)
    with torch.inference_mode():
        spans = score_windows(model, windows, runtime, precision, config.eval_batch_size, max_answer_len)
    predictions = decode(spans, WindowLayout.of(windows), ExampleColumns.of(open_examples(directory, "test")))
    return {p.example_id: p.answer(thresholds) for p in predictions}


def config_without_weights(config: Config) -> Config:
    """The same model built from its config alone: the checkpoint's weights replace the pretrained ones."""
    import dataclasses

    return dataclasses.replace(config, from_scratch=True)


if __name__ == "__main__":
    sys.exit(main())
