"""The export command of the question-answering tasks (``python -m distqa.export`` runs it for their checkpoints): a
Hugging Face directory that ``transformers`` loads offline, as :mod:`distqa.export` shows; what the directory holds is
:mod:`distqa.qa.hf_format`.
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
