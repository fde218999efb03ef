"""The runtime every rank runs on: its process group and device (``runtime``), mixed precision (``precision``), the
data sampler (``sampler``), the random streams (``rng``), the agreed stop on a signal (``stop``), and how the model
spreads over the ranks (``ddp``: DDP's wrap and compile; ``fsdp``: FSDP2's sharding).

A task's code imports what it runs on from here (``from distqa.distributed import Runtime, Precision, ...``): these
names stay put when the modules behind them move.
"""

from distqa.distributed.precision import Precision
from distqa.distributed.runtime import (
    Runtime,
    all_gather_objects,
    all_gather_tensor,
    all_reduce_mean,
    barrier,
    broadcast_object,
    on_device,
)

__all__ = ["Precision", "Runtime", "all_gather_objects", "all_gather_tensor", "all_reduce_mean", "barrier",
           "broadcast_object", "on_device"]
