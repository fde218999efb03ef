"""What tests/launchers/test_skypilot.py and tests/distributed/test_skypilot.py share (template.toml's part
skypilot): the task file and the SkyPilot stand-in, run in SkyPilot's side environment."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from support.repo import REPO_ROOT

TASK = REPO_ROOT / "deploy" / "skypilot" / "task.yaml"
SKY_PYTHON = REPO_ROOT / ".venv-skypilot" / "bin" / "python"
STANDIN = REPO_ROOT / "tests" / "standin" / "skypilot.py"
needs_skypilot = pytest.mark.skipif(not SKY_PYTHON.exists(), reason="no .venv-skypilot: run `make setup`")


def skypilot(home: Path, *args: str) -> Any:
    """tests/standin/skypilot.py in SkyPilot's venv, HOME=home; its JSON answer."""
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    result = subprocess.run([str(SKY_PYTHON), str(STANDIN), *args], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
