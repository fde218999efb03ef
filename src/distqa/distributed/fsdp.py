"""Sharded data parallelism (FSDP2, ``data_parallel = fsdp | hsdp``): the wrap, and what the loop and the
checkpoints do differently with it. DDP's wrap is :mod:`distqa.distributed.ddp`.

DDP keeps a whole replica of the weights, their gradients and the optimizer state on every rank. With
``fsdp`` each rank keeps 1/W of every parameter (a ``DTensor`` sharded on dim 0) with its gradient and
optimizer state; a sharding unit's (:meth:`~distqa.tasks.base.Task.sharding_units`) weights are all-gathered
just before its forward and again for its backward, and its gradients reduce-scattered after it (torchtitan's
``fully_shard`` per transformer block, then the root, which takes the parameters outside the units). With
``hsdp`` the ranks form a 2-D mesh (nodes × processes per node, ``("replicate", "shard")``): each node shards
the model over its own processes and the nodes hold replicas, whose gradients are all-reduced across nodes;
the gathers stay on a node's fast links. Either way the gradient is the mean over all ranks, as with DDP.

What changes besides the wrap (each function below says how):

- accumulation: :func:`gradient_sync_skipped` instead of DDP's ``no_sync``;
- clipping: ``clip_grad_norm_`` over the sharded parameters returns a ``DTensor``; :func:`local_norm` makes it a
  plain tensor for the log;
- mixed precision: ``MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)`` casts the gathered weights, so a
  training forward runs without autocast (as torchtitan's does); fp16's ``GradScaler`` works unchanged: torch's
  DTensor dispatch max-reduces the inf check of ``_amp_foreach_non_finite_check_and_unscale_`` over the mesh
  (``torch/distributed/tensor/_dispatch.py``, ``found_inf_reduce_handler``), so every rank skips the same steps;
- evaluation: :func:`gathered_for_evaluation` holds the whole weights while the evaluator runs, so an evaluator
  may call the model a different number of times on each rank (a sharded forward is a collective);
- checkpoints: :func:`full_model_state` and :func:`full_optimizer_state` are collective and give rank 0 the
  state a DDP run would save, with the same keys, so one file format serves both and a run resumes from either
  on any world size (:func:`load_optimizer_state`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from distqa.config import Config, ConfigError
from distqa.distributed.ddp import compile_enabled, training_module
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime

log = logging.getLogger(__name__)

FULL_ON_RANK_0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Whole tensors, in host memory, on rank 0 only (the others get empty dicts): what rank 0's writer saves."""


def device_mesh(runtime: Runtime, data_parallel: str) -> DeviceMesh:
    """The ranks as FSDP2 sees them: one dimension of all ranks (``fsdp``), or nodes × processes per node
    (``hsdp``: replicate across the first, shard along the second). Collective."""
    if data_parallel == "fsdp":
        return init_device_mesh(runtime.device.type, (runtime.world_size,), mesh_dim_names=("shard",))
    nodes, left_over = divmod(runtime.world_size, runtime.local_world_size)
    # The mesh takes ranks in order: node n must hold ranks n × P … (n + 1) × P - 1 (P processes per node), as
    # torchrun numbers them when every node runs the same number of processes.
    if left_over != 0 or runtime.rank != runtime.node_rank * runtime.local_world_size + runtime.local_rank:
        raise ConfigError(f"data_parallel=hsdp needs the same number of processes on every node: world size "
                          f"{runtime.world_size} is not nodes × {runtime.local_world_size} processes per node "
                          f"(rank {runtime.rank} is local rank {runtime.local_rank} of node {runtime.node_rank}); "
                          "start every node with the same --nproc-per-node, or use data_parallel=fsdp.")
    return init_device_mesh(runtime.device.type, (nodes, runtime.local_world_size),
                            mesh_dim_names=("replicate", "shard"))


def data_parallel_model(model: nn.Module, runtime: Runtime, config: Config, precision: Precision, *,
                        sync_buffers: bool, sharding_units: Callable[[nn.Module], list[nn.Module]]) -> nn.Module:
    """Collective. ``model`` as training steps run it, by ``config.data_parallel``: DDP's wrap
    (:func:`distqa.distributed.ddp.training_module`: one replica per rank, compiled where that is on), or the model
    itself sharded in place over its ``sharding_units`` (:func:`shard_model`), computing in the precision's dtype. One
    process has nothing to share: it runs the model as DDP's wrap leaves it. ``sync_buffers`` and ``sharding_units``
    are the task's (:attr:`~distqa.tasks.base.Task.sync_buffers`, :meth:`~distqa.tasks.base.Task.sharding_units`),
    passed in: the runtime knows no task."""
    if config.data_parallel == "ddp" or not runtime.is_distributed:
        return training_module(model, runtime, config, sync_buffers)
    return shard_model(model, sharding_units(model), runtime, config, precision.dtype)


def shard_model(model: nn.Module, units: list[nn.Module], runtime: Runtime, config: Config,
                param_dtype: torch.dtype | None) -> nn.Module:
    """Collective. ``model`` sharded in place over the mesh of ``config.data_parallel``: ``fully_shard`` on each
    of ``units`` (compiled first, one by one, where :func:`~distqa.distributed.ddp.compile_enabled` says so:
    torchtitan's per-block compile, which keeps the parameter names), then on the root. Its weights must be final (rank
    0's resumed or initial ones, broadcast here: each rank keeps a slice of its copy). ``param_dtype``: the dtype
    forward and backward compute in (bf16, fp16), gradients reduced in fp32; None: fp32 throughout."""
    mesh = device_mesh(runtime, config.data_parallel)
    with torch.no_grad():  # rank 0's weights everywhere, as DDP's constructor makes sure: each rank keeps a slice
        for tensor in (*model.parameters(), *model.buffers()):
            dist.broadcast(tensor, src=0)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype \
        else MixedPrecisionPolicy()
    compiled = compile_enabled(config, runtime.device)
    kinds = ", ".join(sorted({type(unit).__name__ for unit in units})) or "none"
    last = _last_in_module_order(model, units)
    for unit in units:
        if compiled:
            unit.compile(mode=config.compile_mode)  # in place: the names in checkpoints stay the same
        # The last unit's backward begins right after its forward: kept gathered in between, it saves one
        # all-gather per micro-batch (bench/sharding_profile.py), at no extra peak (it would be gathered again).
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=unit is not last)
    # The root's weights (embeddings, heads) stay gathered from its forward to its backward, FSDP2's default for
    # the root; said here because gathered_for_evaluation sets both back after an evaluation.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    log.info("%s: %d sharding units (%s) over a mesh of %s ranks%s", config.data_parallel, len(units),
             kinds,
             " × ".join(str(n) for n in mesh.shape), ", each unit compiled" if compiled else "")
    return model


def _last_in_module_order(model: nn.Module, units: list[nn.Module]) -> nn.Module | None:
    """The sharding unit whose forward runs last among ``units`` (the last of them in ``model.modules()``)."""
    members = {id(unit) for unit in units}
    return next((module for module in reversed(list(model.modules())) if id(module) in members), None)


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync_skipped(training_model: nn.Module) -> Iterator[None]:
    """Backward passes inside accumulate gradients on each rank without reducing them: DDP's ``no_sync``, or for
    a sharded model ``set_requires_gradient_sync(False)`` (the unsharded gradients accumulate until the next
    backward outside, which reduce-scatters their sum)."""
    if not is_sharded(training_model):
        with training_model.no_sync():
            yield
        return
    assert isinstance(training_model, FSDPModule)
    training_model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        training_model.set_requires_gradient_sync(True)


def local_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor: ``clip_grad_norm_`` over sharded parameters returns a replicated
    ``DTensor``, whose value every rank holds."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


@contextlib.contextmanager
def gathered_for_evaluation(model: nn.Module) -> Iterator[None]:
    """Collective on enter and exit. A sharded model's whole weights on every rank while the evaluator runs, so
    its forwards communicate nothing: the ranks may call it different numbers of times (unequal shares of the
    validation data). The weights take their unsharded memory meanwhile (param_dtype bytes per parameter)."""
    units = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        last = _last_in_module_order(model, [unit for unit in units if unit is not model])
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not model and unit is not last, recurse=False)  # as shard_model


def full_model_state(model: nn.Module, is_main_process: bool) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` as a DDP run saves it, on rank 0 (others: {}). Collective for a sharded model
    (each parameter gathered to rank 0's host memory), rank 0's own for a replicated one."""
    if is_sharded(model):
        return get_model_state_dict(model, options=FULL_ON_RANK_0)
    return model.state_dict() if is_main_process else {}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         is_main_process: bool) -> dict[str, Any]:
    """The optimizer's ``state_dict`` as a DDP run saves it (parameters numbered in the order of its groups),
    on rank 0 (others: {}). Collective for a sharded model: torch gives whole tensors keyed by parameter name,
    renumbered here."""
    if not is_sharded(model):
        return optimizer.state_dict() if is_main_process else {}
    by_name = get_optimizer_state_dict(model, optimizer, options=FULL_ON_RANK_0)
    if not by_name:
        return {}
    number = {name: index for index, name in enumerate(_names_in_optimizer_order(model, optimizer))}
    return {"state": {number[name]: state for name, state in by_name["state"].items()},
            "param_groups": [{**group, "params": [number[name] for name in group["params"]]}
                             for group in by_name["param_groups"]]}


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Collective for a sharded model. ``state``, a DDP-numbered ``state_dict`` (:func:`full_optimizer_state`'s,
    or any checkpoint's) whole on every rank, into ``optimizer``: for a sharded model each rank keeps its slice of
    every tensor (torch's ``set_optimizer_state_dict``, keyed by parameter name)."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    names = _names_in_optimizer_order(model, optimizer)
    by_name = {"state": {names[index]: value for index, value in state["state"].items()},
               "param_groups": [{**group, "params": [names[index] for index in group["params"]]}
                                for group in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def _names_in_optimizer_order(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameters' names in the order ``optimizer.state_dict()`` numbers them (group by group)."""
    name_of = {id(parameter): name for name, parameter in model.named_parameters()}
    return [name_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
