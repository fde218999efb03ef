"""What training steps run: the model replicated by DistributedDataParallel, and compiled.

:func:`training_module` wraps the model in DDP with the ``ddp_*`` settings (bucket size, gradient
compression) and the task's choice of buffer synchronisation, and compiles the result where
:func:`compile_enabled` says so; :func:`broadcast_buffers` gives every rank rank 0's buffers before an
evaluation. Each setting's measured effect is in docs/PERFORMANCE.md ("Optimizations").
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from distqa.config import Config
from distqa.distributed.runtime import Runtime


def training_module(model: nn.Module, runtime: Runtime, config: Config, sync_buffers: bool = True,
                    **ddp_options: Any) -> nn.Module:
    """``model`` wrapped by :func:`wrap_ddp`, then compiled where :func:`compile_enabled` says so (the DDP
    module is what is compiled: DDP's optimizer then splits the graph at its buckets, so the all-reduce
    still overlaps the backward)."""
    ddp_model = wrap_ddp(model, runtime, config, sync_buffers, **ddp_options)
    return compile_model(ddp_model, config.compile_mode) if compile_enabled(config, runtime.device) else ddp_model


# torch 2.13 names the buffer broadcast before each forward ``forward_sync_buffers`` and deprecates the old name,
# ``broadcast_buffers``, which is all that older releases know (the CUDA images of GPU clouds often trail: the
# lent H100's was 2.11); the same switch either way.
_SYNC_BUFFERS_OPTION = ("forward_sync_buffers" if "forward_sync_buffers" in
                        inspect.signature(DistributedDataParallel.__init__).parameters else "broadcast_buffers")


def wrap_ddp(model: nn.Module, runtime: Runtime, config: Config, sync_buffers: bool = True,
             **ddp_options: Any) -> nn.Module:
    """DistributedDataParallel over ``model`` (itself at world size 1), with the ``ddp_*`` settings. DDP
    broadcasts rank 0's weights and averages the gradients of every backward pass not under ``no_sync``;
    with ``sync_buffers`` (the task's :attr:`~distqa.tasks.base.Task.sync_buffers`, torch's default) it also
    broadcasts rank 0's buffers before each forward. ``ddp_options`` replace the keyword arguments chosen here
    (bench/ddp_overhead.py measures alternatives)."""
    if not runtime.is_distributed:
        return model
    options = {
        "device_ids": [runtime.device.index] if runtime.device.type == "cuda" else None,
        "bucket_cap_mb": config.ddp_bucket_cap_mb,
        # Not static_graph: with no_sync (our accumulation) torch 2.13 asserts on the first backward, and with
        # that patched it stops all-reducing after the first step (pytorch#187732, open).
        "find_unused_parameters": False,  # every parameter is used in every step: no graph search
        _SYNC_BUFFERS_OPTION: sync_buffers,
        "gradient_as_bucket_view": True,  # grads live in the all-reduce buckets: no copy, less memory
    }
    ddp_model = DistributedDataParallel(model, **(options | ddp_options))
    if config.ddp_comm_hook == "bf16":
        # Gradients cross the network as bf16 and are averaged back into the fp32 buckets.
        ddp_model.register_comm_hook(None, _bf16_compress_hook)
    return ddp_model


def broadcast_buffers(model: nn.Module, runtime: Runtime) -> None:
    """Collective: rank 0's buffers copied into every rank's ``model``, as DDP's ``forward_sync_buffers`` does
    before a training forward. An evaluation calls the bare model, not DDP's forward, after a last training
    forward that updated each rank's own (BatchNorm's running statistics from the rank's own batch)."""
    if runtime.is_distributed:
        with torch.no_grad():
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)


def compile_enabled(config: Config, device: torch.device) -> bool:
    """Whether training runs under torch.compile: the ``compile`` setting, or by default on CUDA GPUs only
    (there it fuses the many small kernels a BERT step launches; on CPUs the compiled step measured slower)."""
    return config.compile if config.compile is not None else device.type == "cuda"


def compile_model(module: nn.Module, mode: str = "default") -> nn.Module:
    """``module`` under torch.compile in ``mode`` (the ``compile_mode`` setting), with PyTorch's default for
    shapes: the first graph is compiled for the first batch's shape, and when trim_padding brings another
    sequence length, once more for any length."""
    return torch.compile(module, mode=mode)


def _bf16_compress_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """torch's ``bf16_compress_hook`` under another name. ``register_comm_hook`` refuses that name unless
    CUDA and NCCL >= 2.10 are present, but gloo sums bf16 tensors too (CPU runs, bench/comm_hook.py).
    No annotations: DDP compares them with ``dist.GradBucket`` by identity, and this module's are strings."""
    return default_hooks.bf16_compress_hook(process_group, bucket)
