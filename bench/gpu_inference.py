"""Evaluation and prediction on the GPU: ``distqa.evaluate`` and ``distqa.predict`` on a small NQ cache.

    .venv/bin/python bench/gpu_inference.py --json inference.json     # one GPU; bench/gpu.sh runs it
    .venv/bin/python bench/gpu_inference.py --device cpu --quick      # smoke run: tiny BERT on CPU

The committed sample (data/nq-sample) is featurised by ``distqa.prepare``'s own code at the bert-base-nq
window settings (512 tokens, question 64, stride 128; the offline tokenizer) into a temporary cache, half
of the examples held out for validation. A checkpoint of the model with random weights (BERT-base sizes,
bench/gpu_common.py) is written in the schema ``distqa.train`` writes (``ModelCheckpoint``). Then the entry
points run in this process, as their command lines would (``main(argv)``), with ``--device``:

  evaluate   ``python -m distqa.evaluate --checkpoint … --nq-cache-dir …``: the validation windows through
             the model (bf16 autocast on GPUs, as the checkpoint's precision "auto" gives), decoding,
             threshold tuning, the metric
  predict    ``python -m distqa.predict --checkpoint … --input data/nq-sample/simplified-nq-test.jsonl``:
             the test file (featurised on the first call, the cache reused after it), decoding, the CSV

One untimed call of each first (CUDA context, cuDNN/cuBLAS handles, predict's featurisation), then the
median wall time of ``--repeats`` calls. Random weights give meaningless answers: this times the path
and proves it runs on the GPU, not the answers' quality.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from gpu_common import add_device_arguments, check_device, model_flags, model_name, synchronize, write_part
from harness import add_common_arguments, bench_config, median, pin_threads

from distqa import evaluate, predict
from distqa.checkpoint.format import ModelCheckpoint, Progress
from distqa.config import REPO_ROOT
from distqa.distributed.rng import seed_everything
from distqa.encoders.pretrained import load_tokenizer
from distqa.qa.model import build_model
from distqa.qa.nq.cache import NQWindows
from distqa.qa.nq.prepared import find_features, prepare_nq
from distqa.record.rundir import versions

SAMPLE = REPO_ROOT / "data" / "nq-sample"
TEST_FILE = SAMPLE / "simplified-nq-test.jsonl"
WINDOW_FLAGS = ("--max-seq-len", "512", "--max-question-len", "64", "--doc-stride", "128")
"""The bert-base-nq preset's window settings."""


def timed_calls(call: Callable[[], int], repeats: int, device_type: str, warm_up: bool) -> list[float]:
    """Seconds of each of ``repeats`` calls of an entry point's ``main``, after one untimed call when
    ``warm_up``; its exit status must be 0 (the entry point prints its own one-line error otherwise)."""
    device = torch.device(device_type)
    seconds = []
    for attempt in range(-int(warm_up), repeats):
        started = time.perf_counter()
        status = call()
        synchronize(device)
        if status != 0:
            raise SystemExit(f"the entry point exited with {status} (its error is above)")
        if attempt >= 0:
            seconds.append(time.perf_counter() - started)
    return seconds


def quietly(main: Callable[[Sequence[str]], int], argv: list[str]) -> Callable[[], int]:
    """``main(argv)`` with its stdout (evaluate's JSON metrics) kept out of the report."""
    def call() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return main(argv)
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=3)
    add_device_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=64, help="windows per forward pass (eval_batch_size)")
    args = parser.parse_args()
    if args.quick:  # one call of each, the first: its time includes the warm-up
        args.repeats = 1
    pin_threads(args.threads)
    device = check_device(args.device)

    with model_flags(model_name(args)) as flags, tempfile.TemporaryDirectory(prefix="bench-gpu-infer-") as work:
        cache = Path(work) / "cache"
        config = bench_config(*flags, *WINDOW_FLAGS, "--task", "nq", "--nq-cache-dir", str(cache),
                              "--validation-fraction", "0.5", "--num-proc", "1", "--eval-batch-size",
                              str(args.batch_size))
        tokenizer = load_tokenizer(config)
        directory = prepare_nq(config, tokenizer, progress=False)
        seed_everything(0)
        checkpoint = Path(work) / "random-weights.pt"
        ModelCheckpoint(model=build_model(config).state_dict(), config=config.to_dict(), task_state=None,
                        evaluation=None, progress=Progress(), versions=versions()).save(checkpoint)

        common = ["--checkpoint", str(checkpoint), "--nq-cache-dir", str(cache), "--device", device.type,
                  "--batch-size", str(args.batch_size)]
        evaluate_s = timed_calls(quietly(evaluate.main, common), args.repeats, device.type, not args.quick)
        # Thresholds given: a checkpoint without tuned ones would only add a warning per call.
        predict_s = timed_calls(quietly(predict.main, [*common, "--input", str(TEST_FILE), "--output",
                                                       str(Path(work) / "submission.csv"), "--long-threshold", "0",
                                                       "--short-threshold", "0"]), args.repeats, device.type,
                                not args.quick)
        validation_windows = len(NQWindows(directory, "validation"))
        test_windows = len(NQWindows(find_features(config, tokenizer, TEST_FILE, labelled=False), "test"))

    write_part(args.json, "inference", device, model=model_name(args), batch_size=args.batch_size, rows=[
        {"name": "evaluate", "windows": validation_windows, "seconds": median(evaluate_s),
         "windows_per_s": validation_windows / median(evaluate_s), "repeats": evaluate_s},
        {"name": "predict", "windows": test_windows, "seconds": median(predict_s),
         "windows_per_s": test_windows / median(predict_s), "repeats": predict_s},
    ])


if __name__ == "__main__":
    main()
