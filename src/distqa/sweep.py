"""Run a hyperparameter sweep whose trials are ordinary multi-node runs, and show its results (docs/SWEEPS.md).

A sweep file (``configs/sweeps/NAME.toml``) says what to vary (each setting a list or a range, plus seeds), how
to search (grid, random, TPE) and how many trials to run; every trial is then a normal run with its own run
directory, ``best.pt``, TensorBoard and MLflow run, started through the same launcher as a run by hand::

    python -m distqa.sweep demo                                  # 2 emulated nodes per trial, one at a time
    python -m distqa.sweep NAME --launcher platform --nodes 4 --parallel 2 -- --data-file /data/...
    python -m distqa.sweep NAME --launcher slurm --nodes 2 --launcher-args "--gpus-per-node 8"
    python -m distqa.sweep --show results/sweeps/demo             # the table of a sweep, running or done

Ctrl-C or SIGTERM stops the running trials with a checkpoint each (exit 75); the same command again resumes them.
The sweep itself is :mod:`distqa.sweeps.runner`; docs/SWEEPS.md says what it does and what it writes.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from dotenv import load_dotenv

from distqa.config import ConfigError
from distqa.config.errors import report_failure
from distqa.config.sources import dotenv_file
from distqa.sweeps.launch import LAUNCHERS
from distqa.sweeps.results import summary
from distqa.sweeps.runner import run_sweep


def main(argv: Sequence[str] | None = None) -> int:
    load_dotenv(dotenv_file(), override=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sweep: %(message)s", datefmt="%H:%M:%S")
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.show:
            print(summary(Path(args.show).resolve()))
            return 0
        return run_sweep(args, shlex.join(["python", "-m", "distqa.sweep", *sys.argv[1:]]))
    except ConfigError as err:
        return report_failure(f"distqa.sweep: {err}", 2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    trainer = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m distqa.sweep", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("sweep", nargs="?", help="configs/sweeps/NAME.toml by NAME, or a path to a .toml")
    parser.add_argument("--show", metavar="DIR", help="print the table of the sweep in DIR (running or done)")
    parser.add_argument("--sweep-dir", help="where the study and the trials' run directories go "
                        "(default: results/sweeps/NAME); on shared storage that every trial's node sees")
    parser.add_argument("--trial-sweep-dir", help="the sweep directory as the trials' nodes see it, when their "
                        "path differs (a platform job's /project/results/...; default: --sweep-dir)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local", help="how trials start (default local)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes of each trial (default 2)")
    parser.add_argument("--procs-per-node", type=int, default=1, help="processes per node (GPUs; default 1)")
    parser.add_argument("--parallel", type=int, default=1, help="trials running at once (default 1)")
    parser.add_argument("--launcher-args", default="", help="the launcher's own options for every trial, as one "
                        "string (platform: '--preset gpu-large'; slurm: sbatch options)")
    args = parser.parse_args(own)
    args.trainer_args = trainer
    if not args.show and not args.sweep:
        parser.error("name a sweep file, or --show DIR")
    for name in ("nodes", "procs_per_node", "parallel"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


if __name__ == "__main__":
    sys.exit(main())
