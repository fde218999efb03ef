"""Malformed input records, the same way for every QA reader: skip and count them, or fail on the first
(``on_bad_line``), and refuse input that is mostly bad (``max_bad_line_fraction``). No torch here."""

from __future__ import annotations

import logging
from typing import Literal

from distqa.config.errors import BadRecordError, DataError

BadLinePolicy = Literal["skip", "fail"]
"""``skip``: count a malformed line or record and go on; ``fail``: stop at the first with a BadRecordError."""
MAX_REPORTED = 20
"""The bad records whose messages a reader keeps, to show."""


def report_bad(message: str, fix: str, policy: BadLinePolicy, reports: list[str]) -> None:
    """One bad record, ``message`` saying where and what: under ``fail`` a BadRecordError ending with ``fix`` (what
    to do about it), under ``skip`` the message kept in ``reports`` (the first :data:`MAX_REPORTED`)."""
    if policy == "fail":
        raise BadRecordError(message + fix) from None
    if len(reports) < MAX_REPORTED:
        reports.append(message)


def check_bad_fraction(source: object, *, total: int, usable: int, bad: int, reports: list[str], limit: float,
                       unit: str = "line", empty: str = "the file holds no examples (it is empty)",
                       logger: logging.Logger) -> None:
    """Refuse input with nothing usable, or with more than ``limit`` of its ``unit``s malformed; warn about a few.

    ``reports`` are the first bad ones' messages (shown in the error); ``empty`` says what an input with no
    ``unit`` at all is. The NQ and SQuAD readers both end with this check; the warning goes to ``logger``, the
    calling reader's, so that it is filtered and attributed under that reader's name.
    """
    shown = "\n  ".join(reports)
    if total == 0:
        raise DataError(f"{source}: {empty}.")
    if not usable:
        raise DataError(f"{source}: none of its {total} {unit}s is usable:\n  {shown}")
    fraction = bad / total
    if fraction > limit:
        raise DataError(
            f"{source}: {bad} of {total} {unit}s ({fraction:.1%}) are malformed, more than "
            f"max_bad_line_fraction={limit}. The first ones:\n  {shown}\n"
            "Check that this is the right file (and not truncated), or raise --max-bad-line-fraction.")
    if bad:
        logger.warning("%s: skipped %d malformed %s(s) of %d; the first: %s", source, bad, unit, total, reports[0])
