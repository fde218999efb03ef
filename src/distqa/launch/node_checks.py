"""What a node checks on its machine before the rendezvous (:mod:`distqa.launch.node`), each failure one line.

The module its workers run (:func:`entry_module_found`), the processes it starts (:func:`processes_here`), and an
elastic range against the global batch (:func:`node_range_check`). A failure is a
:class:`~distqa.launch.node_options.NodeError` with exit status 2. (The storage it must write: worker.sh checks it,
scripts/common.sh's require_writable, as in_job.sh does.)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from distqa.config import ConfigError
from distqa.launch.node_options import Node, NodeError

GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
"""A GPU driver's device node (NVIDIA's, WSL2's, ROCm's): without one torch sees no GPU."""


def entry_module_found(module: str) -> bool:
    """Whether this interpreter finds ``module`` (the repository on its path), without running it; a parent package
    that is missing or fails to import counts as not found."""
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:
        return False


def processes_here(device_nodes: Sequence[str] = GPU_DEVICE_NODES) -> int:
    """One process per GPU torch sees, or 1 without. A node with no GPU driver's device node sees none, and skips
    importing torch just to count none (about 1.5 CPU-seconds a start)."""
    if not any(Path(node).exists() for node in device_nodes):
        return 1
    # torch only to count GPUs where a driver is: about 1.5 CPU-seconds a start.
    import torch

    return max(torch.cuda.device_count(), 1)


def node_range_check(node: Node, nproc: int) -> None:
    """An elastic range (--min-nodes below --nnodes) whose largest world size exceeds the global batch of ``python -m
    distqa.train TRAINER_ARGS`` stops the node before any rendezvous, in one line, instead of failing (and being
    restarted) at the first membership change."""
    # Only this check needs the settings' loader (it brings the task registry in) and distqa.distributed (whose
    # package imports torch): a node of a fixed node count starts without either.
    from distqa.distributed.elastic import NodeRange, check_node_range
    from distqa.settings.sources import load_config

    try:
        config = load_config(["--run-name", node.run_id, *node.trainer_args], check_data_paths=False)
        check_node_range(config, NodeRange(node.min_nodes, node.nnodes, nproc))
    except ConfigError as err:
        raise NodeError(f"configuration error: {err}") from err
