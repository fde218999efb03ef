"""TODO"""

from __future__ import annotations

import subprocess


def failures(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
