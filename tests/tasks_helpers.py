"""What tests/unit/test_tasks.py and tests/distributed/test_tasks.py share: ``python -m distqa.train`` in a process
of its own, its output kept whatever its exit status."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT, clean_env


def train(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distqa.train", *argv], cwd=REPO_ROOT,
                          env=env or clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=120)
