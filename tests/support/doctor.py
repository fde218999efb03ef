"""What tests/unit/test_doctor.py and tests/distributed/test_doctor.py share: the doctor's FAIL lines."""

from __future__ import annotations

import subprocess


def failures(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
