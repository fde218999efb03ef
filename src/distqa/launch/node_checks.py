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
from distqa.distributed.elastic import NodeRange, check_node_range
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
    """An elastic range (--min-nodes below --nnodes) of the trainer whose world sizes do not all split its global
    batch stops the node before any rendezvous, instead of failing (and being restarted) at the first membership
    change (:func:`check_trainer_range`)."""
    try:
        check_trainer_range(NodeRange(node.min_nodes, node.nnodes, nproc),
                            ["--run-name", node.run_id, *node.trainer_args])
    except ConfigError as err:
        raise NodeError(f"configuration error: {err}") from err


def check_trainer_range(node_range: NodeRange, trainer_args: Sequence[str]) -> None:
    """The node's check of the range it exports, before the rendezvous (``distqa.launch.node``): a one-line
    :class:`ConfigError` when ``node_range``'s largest world size exceeds the global batch of ``python -m
    distqa.train TRAINER_ARGS``."""
    # The settings' loader brings the task registry in; only this check needs it.
    from distqa.config.sources import load_config

    check_node_range(load_config(trainer_args, check_data_paths=False), node_range)
