"""The export command of the question-answering tasks (``python -m distqa.export`` runs it for their checkpoints): a
Hugging Face directory that ``transformers`` loads offline; what the directory holds is :mod:`distqa.qa.hf_format`::

    python -m distqa.export --checkpoint results/nq-sample/checkpoints/best.pt --output results/nq-sample/model

Then, with no network and nothing of this repository::

    from transformers import AutoModelForQuestionAnswering, pipeline
    model = AutoModelForQuestionAnswering.from_pretrained("results/nq-sample/model")
    answer = pipeline("question-answering", model="results/nq-sample/model")(question=..., context=...)

and ``python -m distqa.predict --checkpoint results/nq-sample/model …`` writes the same file as from ``best.pt``
(the answer-type head, the tuned thresholds and the run's config are in the directory too). To publish it on a
model hub: ``hf upload ORG/NAME DIR`` (the ``huggingface_hub`` CLI, after ``hf auth login``), or
``model.push_to_hub`` after loading it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.distributed.runtime import setup_logging
from distqa.qa.hf_format import export_model, load_model_checkpoint

log = logging.getLogger("distqa.export")

DESCRIPTION = "Export a trained checkpoint as a Hugging Face directory that ``transformers`` loads offline."


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distqa.export", description=DESCRIPTION)
    parser.add_argument("--checkpoint", required=True, type=Path, help="best.pt or a step-*.pt written by distqa.train")
    parser.add_argument("--output", required=True, type=Path,
                        help="the directory to write (must not exist, or be empty)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    setup_logging(0)
    try:
        checkpoint = load_model_checkpoint(args.checkpoint)
        output = export_model(checkpoint, args.output)
    except ConfigError as err:
        print(f"distqa.export: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # not writable, a full disk: nothing half-written is left under --output
        print(f"distqa.export: error: cannot write {args.output}: {err.strerror or err}", file=sys.stderr)
        return 2
    log.info("exported %s to %s: load it with AutoModelForQuestionAnswering.from_pretrained(%r)", args.checkpoint,
             output, str(output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
