"""The run directory: per-rank logs, the resolved config and ``run.json`` (its layout: docs/CONFIGURATION.md)."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import distqa
from distqa.checkpoint.files import write_json
from distqa.config import REPO_ROOT, Config
from distqa.distributed.runtime import Runtime, setup_logging


def prepare_run_dir(config: Config, runtime: Runtime) -> Path:
    """Create the run directory, log this rank to its own file and (rank 0) record the run."""
    run_dir = config.run_dir
    # Every rank creates the logs folder: on multi-node runs without shared storage it is per node.
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    setup_logging(runtime.rank, run_dir / "logs" / f"rank-{runtime.rank}.log")
    if runtime.is_main_process:
        write_json(run_dir / "config.json", config.to_dict())
        write_json(run_dir / "run.json", run_metadata(runtime))
    return run_dir


def run_metadata(runtime: Runtime) -> dict[str, Any]:
    return {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "argv": sys.argv,
        "world_size": runtime.world_size,
        "nodes": runtime.world_size // runtime.local_world_size,
        "processes_per_node": runtime.local_world_size,
        "device": runtime.device.type,
        "backend": runtime.backend,
        "versions": versions(),
    }


def versions() -> dict[str, str | None]:
    return {"distqa": distqa.__version__, "python": platform.python_version(), "torch": str(torch.__version__),
            "transformers": installed_version("transformers"), "cuda": torch.version.cuda}


@functools.cache
def installed_version(distribution: str) -> str | None:
    """The version pip installed of ``distribution``, read from its metadata without importing it (importing
    transformers cost every training process about a second, and a fork's task may not use it); None when it is
    not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
