"""The Kaggle "TensorFlow 2.0 Question Answering" metric: micro F1 of a submission against gold answers.

Score a submission CSV against a train-format jsonl holding the same examples with their annotations::

    python -m distqa.score --gold data/nq-sample/simplified-nq-test-gold.jsonl --submission submission.csv

It prints one JSON object on stdout, ``{"micro_f1": ..., "long_f1": ..., "short_f1": ..., "precision": ...,
"recall": ..., "tp": ..., "fp": ..., "fn": ..., "examples": ...}``, and exits 0. Any problem with either file
prints one line ``distqa.score: error: <file>:<line>: ...`` on stderr and exits 2; nothing is skipped, since
a skipped row or gold line would change the score.

The metric itself (the rules above and the submission format) is :mod:`distqa.metric`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from distqa.files import DataError
from distqa.metric import SubmissionError, read_gold, read_submission, score_answers

# --- command line ----------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="distqa.score", description="Score a Kaggle NQ submission CSV: micro F1 over long and short rows.",
        epilog="Prints one JSON object on stdout. Errors: one line on stderr, exit status 2.")
    parser.add_argument("--gold", required=True, type=Path,
                        help="train-format jsonl of the submission's examples, with annotations")
    parser.add_argument("--submission", required=True, type=Path,
                        help="CSV with header example_id,PredictionString and rows <id>_long, <id>_short")
    args = parser.parse_args(argv)
    try:
        for path, what in ((args.gold, "gold"), (args.submission, "submission")):
            if not path.is_file():
                raise DataError(f"{path}: no such {what} file")
        read_submission(args.submission)  # the format first: reading a large gold file takes minutes
        golds = read_gold(args.gold)
        result = score_answers(golds, read_submission(args.submission, expected_ids=golds.keys()))
    except (DataError, SubmissionError, OSError) as err:
        print(f"{parser.prog}: error: {str(err).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
