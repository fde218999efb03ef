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
import dataclasses
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
    from distqa.distributed import distributed_runtime, is_main_process, read_torchrun_env, setup_logging
    from distqa.score import write_submission

    args = build_arg_parser().parse_args(argv)
    load_dotenv(".env", override=False)
    try:
        setup_logging(read_torchrun_env()["RANK"])
        require_file(args.input)
        overrides = {"nq_cache_dir": args.nq_cache_dir, "num_proc": args.num_proc, "eval_batch_size": args.batch_size}
        with distributed_runtime(args.device) as runtime:
            predictor = Predictor.from_checkpoint(args.checkpoint, runtime, args.long_threshold,
                                                  args.short_threshold, **overrides)
            answers = predictor.answers(predictor.predict_file(args.input))
            if is_main_process():
                write_submission(args.output, answers)
                log.info("wrote %s: %d examples, %d long and %d short answers", args.output, len(answers),
                         sum(bool(a.long) for a in answers.values()), sum(bool(a.short) for a in answers.values()))
    except (ConfigError, DataError) as err:
        print(f"distqa.predict: error: {err}", file=sys.stderr)
        return 2
    return 0


class Predictor:
    """A trained model with its tokenizer, window settings and decoding thresholds.

    In a notebook (one process)::

        predictor = Predictor.from_checkpoint("results/nq-sample/checkpoints/best.pt", local_runtime("cpu"))
        predictions = predictor.predict_file("data/nq-sample/simplified-nq-test.jsonl")
        predictor.answers(predictions)   # {example_id: Answer(long="start:end", short="start:end"|"YES"|"NO"|"")}

    Under torchrun every rank calls :meth:`predict_file` with the same file and gets the same result.
    """

    def __init__(self, model: Any, config: Config, runtime: Any, thresholds: Any, max_answer_len: int,
                 evaluation: dict[str, Any] | None = None) -> None:
        from distqa.pretrained import load_tokenizer

        self.model, self.config, self.runtime = model, config, runtime
        self.thresholds, self.max_answer_len = thresholds, max_answer_len
        self.evaluation = evaluation
        """The validation metrics stored with the checkpoint (its step included); None if it has none."""
        self.tokenizer = load_tokenizer(config)

    @classmethod
    def from_checkpoint(cls, path: Path | str, runtime: Any, long_threshold: float | None = None,
                        short_threshold: float | None = None, **overrides: Any) -> Predictor:
        """Load ``best.pt`` or a ``step-*.pt``; ``overrides`` replace config values (None = keep)."""
        from distqa.checkpoint import MODEL_STATE, load_checkpoint
        from distqa.evaluate import Thresholds
        from distqa.model import build_model

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"checkpoint {path} does not exist; train first (see the README) or pass "
                              "results/<run>/checkpoints/best.pt")
        try:
            state = load_checkpoint(path, required=MODEL_STATE)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        config = inference_config(state["config"], device=runtime.device.type,
                                  **{k: v for k, v in overrides.items() if v is not None})
        model = build_model(dataclasses.replace(config, from_scratch=True))  # the weights come from the file
        model.load_state_dict(state["model"])
        model.to(runtime.device).eval()
        decoding = state.get("decoding") or {}
        if not decoding and (long_threshold is None or short_threshold is None):
            log.warning("%s holds no tuned thresholds (no evaluation ran in its training); using 0: "
                        "answer when the best span beats [CLS]'s null score", path)
        thresholds = Thresholds(
            long_threshold if long_threshold is not None else decoding.get("long_threshold", 0.0),
            short_threshold if short_threshold is not None else decoding.get("short_threshold", 0.0))
        max_answer_len = decoding.get("max_answer_len", config.max_answer_len)
        log.info("loaded %s: thresholds long %.3f short %.3f, max answer length %d", path, thresholds.long,
                 thresholds.short, max_answer_len)
        return cls(model, config, runtime, thresholds, max_answer_len, state.get("evaluation"))

    def featurize(self, source: Path | str) -> Path:
        """The feature cache of ``source`` (unlabelled windows, every line checked); rank 0 builds it
        while the others wait, so there is one writer per cache."""
        from distqa.data import nq_request, prepare_nq
        from distqa.data.cache import cached
        from distqa.distributed import barrier, is_main_process

        source = Path(source)
        if is_main_process():
            prepare_nq(self.config, self.tokenizer, source=source, labelled=False, on_bad_line="fail",
                       progress=self.config.progress_bar)
        barrier()
        directory = cached(nq_request(self.config, self.tokenizer, source, labelled=False), self.config.nq_cache_path)
        assert directory is not None, "rank 0 built the cache before the barrier"
        return directory

    def predict_file(self, source: Path | str) -> list[Any]:
        """One :class:`~distqa.evaluate.Prediction` per example of ``source``, in file order."""
        import torch

        from distqa.data.cache import NQWindows, open_examples
        from distqa.evaluate import ExampleColumns, WindowLayout, decode, score_windows
        from distqa.optim import Precision

        directory = self.featurize(source)
        windows = NQWindows(directory, "test")
        precision = Precision.choose(self.config.precision, self.runtime.device)
        with torch.inference_mode():
            spans = score_windows(self.model, windows, self.runtime, precision, self.config.eval_batch_size,
                                  self.max_answer_len)
        return decode(spans, WindowLayout.of(windows), ExampleColumns.of(open_examples(directory, "test")))

    def answers(self, predictions: list[Any]) -> dict[int, Any]:
        """The submission rows of ``predictions`` under this predictor's thresholds."""
        return {p.example_id: p.answer(self.thresholds) for p in predictions}


def inference_config(saved: dict[str, Any], **overrides: Any) -> Config:
    """The training config of a checkpoint, made independent of the training data.

    Prediction needs the model, tokenizer and window settings, not the training file, which need
    not exist where predict runs: the dataset is set to "dummy" so that it is not looked for.
    """
    unknown = sorted(set(saved) - set(FIELDS))
    if unknown:
        log.warning("ignoring settings this version does not know: %s", ", ".join(unknown))
    values = {name: value for name, value in saved.items() if name in FIELDS}
    return Config(**values | {"dataset": "dummy", "resume": "none"} | overrides)


if __name__ == "__main__":
    sys.exit(main())
