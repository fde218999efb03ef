"""Featurise Natural Questions once into the feature cache that ``train --dataset nq`` reads.

The committed sample with the default (tiny-cpu) settings::

    python -m distqa.prepare

The real data, 16 processes (the platform's ``prepare`` job runs this)::

    python -m distqa.prepare --preset bert-base-nq --nq-train-file data/nq/simplified-nq-train.jsonl \\
        --nq-cache-dir /data/nq-cache --num-proc 16

It reads the settings the way ``python -m distqa.train`` does (preset, .env, DISTQA_*, flags), so the
training run finds the cache by the same fingerprint; its flags (``--help``) are those that determine
the cache and how it is built. Re-running with unchanged input, tokenizer
and window settings reuses the cache at once; changing any of them builds a new one. Run it before
launching a multi-process training: ranks never featurise while others wait in a collective.
Prints the cache directory on stdout; the summary goes to the log (stderr). With
``--only-if-nq`` (what the launchers pass, followed by the trainer's arguments) it does nothing
unless those arguments select ``--dataset nq``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dotenv import load_dotenv

from distqa.config import ConfigError
from distqa.data.features import prepare_nq
from distqa.data.nq import DataError
from distqa.settings import PREPARE, TRAIN, load_config


def main(argv: Sequence[str] | None = None) -> int:
    load_dotenv(".env", override=False)
    # Not distqa.distributed's logging: that imports torch, and each featurising process re-imports
    # this module (multiprocessing's spawn), which should stay light.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    argv = list(sys.argv[1:] if argv is None else argv)
    # The launchers pass the trainer's own arguments with this flag: prepare what that run will read.
    only_if_nq = "--only-if-nq" in argv
    argv = [arg for arg in argv if arg != "--only-if-nq"]
    try:
        # The launchers pass the trainer's arguments with --only-if-nq: then it accepts all of train's flags.
        sections = TRAIN if only_if_nq else PREPARE
        config = load_config(argv, prog="python -m distqa.prepare", sections=sections, description=(
            "Build the NQ feature cache that `python -m distqa.train` reads. With --only-if-nq, the arguments "
            "are a training command line (all of train's flags): prepare what that run reads, if it reads NQ."))
        if only_if_nq and config.dataset != "nq":
            return 0
        # Here, not at the top: transformers imports torch, and each featurising process re-imports this
        # module (multiprocessing's spawn); they need only the tokenizers library.
        from distqa.pretrained import load_tokenizer

        directory = prepare_nq(config, load_tokenizer(config), progress=config.progress_bar)
    except (ConfigError, DataError) as err:
        print(f"distqa.prepare: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the cache directory is not writable, the disk is full, …
        print(f"distqa.prepare: error: {err}; check nq_cache_dir and the free space there.", file=sys.stderr)
        return 1
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
