"""How the commands refuse: the errors that name a bad input or a full disk, and the one-line report an entry
point gives for them (stderr, its log files, and scripts/worker.sh's report folder). Imports no torch."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

WORKER_REPORT_DIR_VARIABLE = "WORKER_STOP_REPORT_DIR"
"""The node-local folder scripts/worker.sh gives its workers for a one-line report of why they ended (torchrun
itself exits with 1 whatever their codes were): distqa.distributed.stop's ``rank-<R>`` after a graceful stop, and
``exit-<CODE>-rank-<R>`` from :func:`report_failure`."""

PEER_LOST_REPORT = "peer-lost-rank-{rank}"
"""A worker's report in that folder when it left because a peer was lost, after saving what it held
(distqa.training.peer_loss): distqa.launch.agent then restarts the workers into a new rendezvous round without
spending one of ``--max-restarts`` (a membership change, as in torchrun)."""


class DataError(ValueError):
    """An input file cannot be used; the message names the file, line and field, and the fix. Entry points
    print it in one line (exit 2); a task raises it for data it cannot read."""


class BadRecordError(DataError):
    """A malformed line or record read with ``on_bad_line='fail'``; the message says what is wrong and to fix or remove
    it. Only the commands that have ``--on-bad-line`` (prepare, train) add :data:`SKIP_ADVICE` where they print it:
    predict and score read every record, so they have no way to skip one to advise."""


SKIP_ADVICE = "Or pass --on-bad-line skip to skip and count bad records."


class DiskFullError(OSError):
    """A write failed for lack of space (or quota); the message names the folder and its free space."""


def print_error(line: str) -> None:
    """``line`` and its newline on stderr in one write: the ranks of a job share their agent's pipe, and with
    ``PYTHONUNBUFFERED`` print() writes the text and the newline apart, so two ranks' lines could run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def report_failure(message: str, exit_code: int) -> int:
    """An entry point's refusal, said once everywhere it is looked for: ``message`` on stderr
    (:func:`print_error`), in this process's log files (``logs/rank-<R>.log`` once the run directory exists),
    and, under ``scripts/worker.sh``, in ``$WORKER_STOP_REPORT_DIR/exit-<CODE>-rank-<R>``: worker.sh then exits
    with ``exit_code`` instead of torchrun's 1, and distqa.launch.agent leaves out torchrun's ChildFailedError
    traceback. Returns ``exit_code``."""
    # The report first: once the line is out, the agent may stop this process at any moment (the other nodes
    # refused too and took the rendezvous store with them, distqa.launch.agent.main), and it reads the report then.
    folder = os.environ.get(WORKER_REPORT_DIR_VARIABLE)
    if folder and Path(folder).is_dir():
        rank = os.environ.get("RANK", "0")
        (Path(folder) / f"exit-{exit_code}-rank-{rank}").write_text(message + "\n")
    print_error(message)
    record = logging.LogRecord("distqa", logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):  # stderr has it already
            handler.handle(record)
    return exit_code
