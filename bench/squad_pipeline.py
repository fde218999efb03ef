"""SQuAD featurisation: the squad task's cache build against run_qa.py's ``prepare_train_features``.

    .venv/bin/python bench/squad_pipeline.py            # about 2 minutes on 2 cores
    .venv/bin/python bench/squad_pipeline.py --quick    # smoke test (seconds; figures meaningless)

The same file and tokenizer for both: synthetic SQuAD v2.0 questions (``distqa.qa.squad.synthetic``, a third
unanswerable) as JSON Lines in the Hugging Face squad schema, which both read, and data/tiny-bert's tokenizer;
run_qa.py's default windows, max_seq_length 384 with doc_stride 128 (our ``window_overlap``), every window padded
to 384 (run_qa.py's ``pad_to_max_length``; our cache stores windows padded too). Each contender goes from the file
on disk to features on disk, with fresh caches at every repeat:

  ours     ``distqa.qa.squad.cache.build_squad_cache``, what ``python -m distqa.prepare --task squad`` runs:
           every record read and checked, the tokenizer's pair encoding with overflowing windows straight from
           ``tokenizers``, labels from the offsets with numpy, Arrow files
  run_qa   ``load_dataset("json")`` + ``Dataset.map(prepare_train_features, batched=True)``, the function as
           run_qa.py has it (``bench/run_qa_features.py``): the tokenizer called through ``transformers`` (Python
           lists of every field), labels by Python loops, ``datasets``' Arrow cache

Both in one process: run_qa.py's default ``preprocessing_num_workers``, and ours for a file of this size
(``num_proc`` 0 starts one process per 16 MB of input: a process takes a second or two to start, which a few MB
do not win back). The tokenizer's own Rust threads work for both. Before the timings the script checks that both
give the same windows and labels (run_qa.py's labels differ only where its documented edge case strikes: an
answer that starts in a window's last context token), so the ratio compares equal work. Target: ours >= 2 ×
run_qa in questions per second (interleaved repeats, medians).
"""

from __future__ import annotations

import argparse
import functools
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
from harness import (
    Target,
    add_common_arguments,
    interleaved,
    machine_line,
    median,
    pin_threads,
    print_table,
    print_targets,
    spread,
)
from run_qa_features import DOC_STRIDE, MAX_SEQ_LENGTH, prepare_train_features
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from distqa.encoders.config import TINY_MODEL_DIR
from distqa.qa.squad.cache import SquadCacheRequest, SquadWindows, build_squad_cache
from distqa.qa.squad.synthetic import write
from distqa.qa.squad.windows import SquadWindowSettings

MAX_QUESTION_LEN = 64
TARGET = 2.0


def run_qa(source: Path, tokenizer: PreTrainedTokenizerBase, work: Path, num_proc: int | None) -> datasets.Dataset:
    """run_qa.py's path from a training file to features: load_dataset, then map."""
    raw = datasets.load_dataset("json", data_files={"train": str(source)}, cache_dir=str(work))["train"]
    return raw.map(functools.partial(prepare_train_features, tokenizer=tokenizer), batched=True, num_proc=num_proc,
                   remove_columns=raw.column_names)


def ours(source: Path, tokenizer: PreTrainedTokenizerBase, work: Path, num_proc: int) -> Path:
    settings = SquadWindowSettings(MAX_SEQ_LENGTH, MAX_QUESTION_LEN, DOC_STRIDE)
    request = SquadCacheRequest.from_tokenizer(tokenizer, source, settings)
    return build_squad_cache(request, work, num_proc=num_proc)


def same_work(source: Path, tokenizer: PreTrainedTokenizerBase, work: Path) -> str:
    """Both contenders' windows and labels compared, window by window; a SystemExit if they are not the same work."""
    theirs = run_qa(source, tokenizer, work / "check-run-qa", None)
    mine = SquadWindows(ours(source, tokenizer, work / "check-ours", 1), "train")
    if len(theirs) != len(mine):
        raise SystemExit(f"run_qa.py made {len(theirs)} windows, ours {len(mine)}")
    labels = 0
    for index, row in enumerate(theirs):
        window = mine[index]
        if row["input_ids"] != window["input_ids"].tolist():
            raise SystemExit(f"window {index}: other ids than run_qa.py's")
        labels += (row["start_positions"], row["end_positions"]) == (window["start_positions"], window["end_positions"])
    return f"{len(mine)} windows with run_qa.py's ids, {labels} with its labels too"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, default_repeats=5)
    parser.add_argument("--articles", type=int, default=1500, help="synthetic articles (about 9 questions each)")
    args = parser.parse_args()
    if args.quick:
        args.articles, args.repeats = 20, 3
    pin_threads(args.threads)
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    logging.getLogger("distqa").setLevel(logging.WARNING)
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL_DIR)
    print(machine_line(args.threads))

    with tempfile.TemporaryDirectory(prefix="squad-bench-") as tmp:
        work = Path(tmp)
        source = work / "train.jsonl"
        counts = write(source, args.articles, seed=0)
        questions = counts["questions"]
        print(f"file: {questions} questions ({counts['unanswerable']} unanswerable), {source.stat().st_size / 1e6:.1f} "
              f"MB of JSON Lines; windows of {MAX_SEQ_LENGTH} tokens, overlap {DOC_STRIDE}; tiny-bert tokenizer")
        print("same work: " + same_work(source, tokenizer, work))

        def timed(build: Callable[[Path, PreTrainedTokenizerBase, Path, Any], object], num_proc: Any
                  ) -> Callable[[], float]:
            def run() -> float:
                target = work / f"run-{time.monotonic_ns()}"  # a fresh cache every time
                started = time.perf_counter()
                build(source, tokenizer, target, num_proc)
                seconds = time.perf_counter() - started
                shutil.rmtree(target, ignore_errors=True)
                return questions / seconds
            return run

        figures = interleaved({"ours": timed(ours, 1), "run_qa": timed(run_qa, None)}, args.repeats)
    rates = {name: median(values) for name, values in figures.items()}
    print_table("questions per second, file to features on disk, one process", [
        (name, f"{rate:9.0f}", spread(figures[name])) for name, rate in rates.items()])
    print_targets([Target("ours / run_qa questions/s, 1 process", rates["ours"] / rates["run_qa"], TARGET,
                          at_most=False)])


if __name__ == "__main__":
    main()
