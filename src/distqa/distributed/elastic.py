"""Elastic membership: a run on any node count in ``MIN:MAX`` (``scripts/worker.sh --min-nodes``).

torchrun's agents (``--nnodes MIN:MAX``) meet in a new rendezvous round after a node is lost, or when one joins;
every round restarts the workers, which resume from the newest checkpoint at the round's world size. The global
batch stays the same at any world size: the ranks take shares of it that differ by at most one example, padded to
whole micro-batches, and weigh their loss by their share (:mod:`distqa.distributed.sampler`,
:mod:`distqa.training.step_plan`), so the range need not divide it. What it must do is give every rank an example:
:func:`check_node_range`, run by the node before the rendezvous (``launch.node``) and by every worker
before its process group. :func:`membership_line` is the one line rank 0 logs for each round.

``worker.sh`` exports the range as :data:`RANGE_VARIABLE` (torchrun tells a worker the node count of its round,
``GROUP_WORLD_SIZE``, not the range), and ``distqa.launch.agent`` the rendezvous round as :data:`ROUND_VARIABLE`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distqa.config import Config, ConfigError

RANGE_VARIABLE = "WORKER_NODE_RANGE"
"""``MIN:MAX`` nodes, exported by ``worker.sh`` (not DISTQA_*: those are settings, which enter the config hash)."""
ROUND_VARIABLE = "WORKER_RENDEZVOUS_ROUND"
"""The c10d rendezvous round the workers were started in, exported by ``distqa.launch.agent`` (the same on every
node)."""


@dataclass(frozen=True)
class NodeRange:
    """The node counts a run may have, and the processes on each node."""

    min_nodes: int
    max_nodes: int
    procs_per_node: int

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> NodeRange | None:
        """The range ``worker.sh`` exported, with torchrun's ``LOCAL_WORLD_SIZE``; None outside worker.sh."""
        environ = os.environ if environ is None else environ
        text = environ.get(RANGE_VARIABLE, "")
        low, _, high = text.partition(":")
        if not (low.isdigit() and high.isdigit()):
            return None
        return cls(int(low), int(high), int(environ.get("LOCAL_WORLD_SIZE", "1") or 1))

    @property
    def elastic(self) -> bool:
        return self.min_nodes < self.max_nodes

    @property
    def world_sizes(self) -> list[int]:
        return [nodes * self.procs_per_node for nodes in range(self.min_nodes, self.max_nodes + 1)]

    def __str__(self) -> str:
        return (f"{self.min_nodes}:{self.max_nodes} nodes × {self.procs_per_node} process(es) = world sizes "
                f"{', '.join(map(str, self.world_sizes))}")


def check_node_range(config: Config, node_range: NodeRange | None) -> None:
    """A one-line :class:`ConfigError` when the range's largest world size exceeds the global batch: at that
    membership some ranks would have no example of a step to train on. Any other range trains the same global batch
    at every world size (uneven shares, :meth:`~distqa.config.Config.accumulation_steps`). ``grow_global_batch`` is
    not applied over a range (``distqa.train``): the batch would change with the membership, and a run resumed at
    another world size would train another global batch than the one it started with."""
    if node_range is None or not node_range.elastic:
        return
    batch, largest = config.global_batch_size, max(node_range.world_sizes)
    if largest <= batch:
        return
    nodes = batch // node_range.procs_per_node
    fewer = f"a --nnodes of at most {nodes}" if nodes >= node_range.min_nodes else "fewer nodes"
    grow = " (grow_global_batch does not apply over a range: the batch would change with the membership)" \
        if config.grow_global_batch else ""
    raise ConfigError(
        f"the node range {node_range} exceeds global_batch_size {batch} at world size "
        f"{', '.join(str(size) for size in node_range.world_sizes if size > batch)}: some ranks would have no "
        f"example to train on{grow}; use a global_batch_size of at least {largest}, or {fewer}.")


def range_report(config: Config, node_range: NodeRange | None) -> tuple[str, list[str]]:
    """The doctor's line about the node range (how each world size trains the global batch), and its problem when
    the range exceeds the global batch."""
    if node_range is None:
        return "nodes: no range (not started by scripts/worker.sh)", []
    if not node_range.elastic:
        return f"nodes: fixed at {node_range.max_nodes} (worker.sh --min-nodes sets a range)", []
    try:
        check_node_range(config, node_range)
    except ConfigError as err:
        return f"nodes: {node_range}, elastic", [str(err)]
    splits = "; ".join(f"at {size}: {split_line(config, size)}" for size in node_range.world_sizes)
    return f"nodes: {node_range}, elastic: {splits}", []


def split_line(config: Config, world_size: int) -> str:
    """How ``world_size`` ranks train the global batch, for the trainer's plan, the membership line and the doctor:
    "global batch 32 = shares of 11/10 per rank × 3 ranks, 3 micro-batches of 4" (the shares of
    :func:`distqa.distributed.sampler.share_of`; here without torch, which a node's check before the rendezvous
    does not load)."""
    batch, accumulation = config.global_batch_size, config.accumulation_steps(world_size)
    largest, smallest = -(-batch // world_size), batch // world_size
    shares = f"{largest}" if largest == smallest else f"{largest}/{smallest}"
    return (f"global batch {batch} = shares of {shares} per rank × {world_size} ranks, {accumulation} "
            f"{'micro-batch' if accumulation == 1 else 'micro-batches'} of {config.per_rank_batch_size}")


def membership_line(round_number: str, node_addresses: Sequence[str], config: Config, world_size: int) -> str:
    """What rank 0 logs when the workers of a rendezvous round start: who, and how they split the global batch."""
    return (f"membership: round {round_number}: {len(node_addresses)} node(s) ({', '.join(node_addresses)}), "
            f"world size {world_size}, {split_line(config, world_size)}")
