"""The memory check's task-neutral half: the settings of a training step that memory depends on (:class:`Step`,
the data-parallel layout included), an estimate of one step's peak (:class:`StepMemory`), what a task's estimate
offers (:class:`TrainingMemory`, what ``Task.training_memory`` returns), what sharding does to the training state
(:class:`ShardingUnits`), what a GPU must have besides the tensors, and the fixes when a step does not fit (a
smaller micro-batch, activation checkpointing, the smallest sharded layout that fits, a larger GPU). The doctor
uses it; a task brings the estimate (a transformers encoder's: ``encoders/memory.py``). No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

GiB = 2**30
CUDA_RESERVED_BYTES = 2**30
"""What a training process's GPU memory holds besides its tensors: the CUDA context, cuBLAS/cuDNN workspaces
and NCCL's buffers (together about 1 GiB on an H100 with NCCL; a guess with room, not a measurement)."""
ALLOCATOR_SLACK = 0.10
"""PyTorch's caching allocator rounds blocks up and fragments under changing batch shapes: the tensors' peak
may need this fraction more of reserved memory (the doctor's margin; bench/gpu.sh reports the real peak)."""

PrecisionName = Literal["fp32", "bf16", "fp16"]
DataParallel = Literal["ddp", "fsdp", "hsdp"]


@dataclass(frozen=True)
class Step:
    """The settings of a training step that its memory depends on, besides the model."""

    micro_batch: int
    precision: PrecisionName
    device_type: str
    """'cuda' or 'cpu': the kernels, and so what they keep, differ (module docstring)."""
    activation_checkpointing: bool = False
    gradients_persist: bool = True
    """DDP's buckets (world size > 1) or gradient accumulation keep the gradients through the whole step."""
    data_parallel: DataParallel = "ddp"
    """How the ranks share the model (the setting ``data_parallel``): 'ddp' a whole replica on every rank; 'fsdp'
    and 'hsdp' shard it over :attr:`shards` ranks (:class:`ShardingUnits`)."""
    shards: int = 1
    """Ranks that one copy of the weights, gradients and AdamW state is split over: 1 under ddp, the world size
    under fsdp, a node's processes under hsdp (:func:`shards_of`)."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step: sharded, the ones before the last keep unsharded gradients."""

    @property
    def sharded(self) -> bool:
        return self.data_parallel != "ddp"

    def layout(self) -> str:
        """The data-parallel layout in a few words, for the doctor's line."""
        if self.data_parallel == "fsdp":
            return f"fsdp (weights, gradients and AdamW state sharded over {self.shards} rank(s))"
        if self.data_parallel == "hsdp":
            return f"hsdp (sharded over a node's {self.shards} process(es), replicated across nodes)"
        return "ddp (a whole replica on every rank)"


def shards_of(data_parallel: DataParallel, world_size: int, processes_per_node: int) -> int:
    """Over how many ranks ``data_parallel`` splits the training state: all of them (fsdp), a node's (hsdp), none
    (ddp)."""
    return {"ddp": 1, "fsdp": world_size, "hsdp": processes_per_node}[data_parallel]


@dataclass(frozen=True)
class StepMemory:
    """The estimate: the parts of the step's peak in bytes, and when the peak happens."""

    parts: dict[str, int]
    """What is allocated at the peak, by kind (weights, gradients, AdamW moments, weight copies, activations,
    transient)."""
    moment: str
    """'forward end', 'backward start', 'backward' (a layer recomputed with checkpointing) or 'backward end'."""

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """The peak and its parts, in GiB (MiB for a peak under 1 GiB)."""
        unit, size, decimals = ("GiB", GiB, 2) if self.peak >= GiB else ("MiB", 2**20, 1)
        shown = ", ".join(f"{name} {part / size:.{decimals}f}" for name, part in self.parts.items() if part)
        return f"{self.peak / size:.1f} {unit} at the {self.moment} ({shown} {unit})"


class TrainingMemory(Protocol):
    """One rank's memory in a training step of a task's model, as a function of the step's settings."""

    def estimate(self, step: Step) -> StepMemory:
        """The peak of one training step with the settings of ``step``."""
        ...

    def describe(self, step: Step) -> str:
        """What the estimate of ``step`` assumed, in a few words, with the module that made it (the doctor's line
        says "estimated for" this)."""
        ...


@dataclass(frozen=True)
class ShardingUnits:
    """A model's trainable parameters as FSDP2 groups them for sharding: ``fully_shard`` on each sharding unit (a
    transformer layer), then on the root module, which holds the rest (embeddings, heads). What a task's estimate
    puts in place of DDP's replica when the step is sharded (:meth:`state`)."""

    parameters: int
    largest: int
    """Parameters of the largest unit (a layer): the unit whose all-gathered copy is largest."""
    root: int
    """Parameters in no unit but the root's (embeddings, heads)."""

    def state(self, step: Step, moment: Literal["forward", "backward", "end"]) -> dict[str, int]:
        """Bytes of the training state of one rank of a sharded ``step`` during the forward, the backward, or at
        the end of the backward (every gradient made), as distqa.distributed.fsdp runs it: fp32 shards, and FSDP2's
        ``MixedPrecisionPolicy(param_dtype=<the step's precision>, reduce_dtype=fp32)`` instead of autocast. Each
        part in words: docs/FAULT_TOLERANCE.md, "The memory check"; where FSDP2 does what it counts: a micro-batch
        without gradient sync (``set_requires_gradient_sync(False)``) keeps every unit's unsharded fp32 gradient
        (``FSDPParamGroup.post_backward`` returns before reducing; ``FSDPParam.to_accumulated_grad_if_needed``
        upcasts it to the reduce dtype); the root stays gathered from its forward to the end of the backward
        (``FSDPState._lazy_init``); one unit is gathered ahead of the one computing (implicit forward prefetch,
        ``_backward_prefetch``), and in the backward two units' gradients are held in the compute dtype and in fp32
        (the one being made, the one before still reducing). A unit's gathered weights, freed after its forward and
        gathered again for its backward, are what its matmuls keep: there are no autocast copies besides them.
        """
        shards = max(1, step.shards)
        compute = 4 if step.precision == "fp32" else 2
        gradients = 4 * self.parameters if step.accumulation_steps > 1 else 4 * self.parameters // shards
        gathered = compute * self.root + 2 * compute * self.largest
        if moment == "backward":
            gathered += 2 * (compute + 4) * self.largest
        elif moment == "end":
            gathered = compute * self.root + (compute + 4) * self.root
        return {"weights": 4 * self.parameters // shards, "AdamW moments": 8 * self.parameters // shards,
                "gradients": gradients, "gathered": gathered}


GPU_MEMORY_BYTES = ((24.1e9, "L4 or A10G (24 GB)"), (42.3e9, "A100 40GB"), (85.0e9, "A100 80GB or H100 80GB"),
                    (150.0e9, "H200 (141 GB)"))
"""The bf16 GPUs distqa.record.throughput knows, smallest first, with the memory torch reports for them
(``torch.cuda.get_device_properties(...).total_memory``, a little more than the name's GB for HBM cards)."""


def needed_bytes(peak: int) -> int:
    """What a GPU must have for a step whose tensors peak at ``peak`` bytes: the allocator's margin on top, and
    what CUDA, its libraries and NCCL take besides the tensors."""
    return int(peak * (1 + ALLOCATOR_SLACK)) + CUDA_RESERVED_BYTES


def smallest_gpu(peak: int) -> str | None:
    """The smallest GPU of :data:`GPU_MEMORY_BYTES` a step peaking at ``peak`` bytes fits; None: none does."""
    return next((name for total, name in GPU_MEMORY_BYTES if needed_bytes(peak) <= total), None)


def fixes(memory: TrainingMemory, step: Step, total: int, allowed_micro_batch: Callable[[int], bool],
          can_checkpoint: bool) -> list[str]:
    """What makes ``step`` fit a GPU of ``total`` bytes, each with its estimate: the largest smaller micro-batch
    that fits (among those ``allowed_micro_batch`` accepts; the gradients then persist, since accumulation
    keeps the global batch), activation checkpointing (when ``can_checkpoint`` and it is off), a larger GPU."""
    found = []
    for micro_batch in range(step.micro_batch - 1, 0, -1):
        smaller = memory.estimate(replace(step, micro_batch=micro_batch, gradients_persist=True)).peak
        if allowed_micro_batch(micro_batch) and needed_bytes(smaller) <= total:
            found.append(f"--per-rank-batch-size {micro_batch} (the largest that fits: {smaller / GiB:.1f} GiB; "
                         "accumulation keeps the global batch)")
            break
    if can_checkpoint and not step.activation_checkpointing:
        checkpointed = memory.estimate(replace(step, activation_checkpointing=True)).peak
        if needed_bytes(checkpointed) <= total:
            found.append(f"--activation-checkpointing true ({checkpointed / GiB:.1f} GiB, about a third more compute)")
    gpu = smallest_gpu(memory.estimate(step).peak)
    found.append(f"a GPU with more memory ({gpu} or larger)" if gpu else
                 "more memory than any GPU distqa knows has: a smaller micro-batch with activation checkpointing")
    return found


SHARDED_WORLD_SIZES = tuple(2 ** power for power in range(1, 10))
"""The GPU counts the doctor tries for a sharded layout that fits: 2, 4, ... 512 (whole nodes of 8 from 8 on)."""


def smallest_sharded_layout(memory: TrainingMemory, fsdp_step_at: Callable[[int], Step | None],
                            total: int) -> tuple[int, StepMemory] | None:
    """The fewest GPUs of :data:`SHARDED_WORLD_SIZES` on which full sharding fits a GPU of ``total`` bytes, with its
    estimate; None: none does. ``fsdp_step_at(n)`` is the run's step with fsdp on n GPUs (its accumulation is the
    run's at that world size), None where the run's global batch cannot be split over n GPUs."""
    for world_size in SHARDED_WORLD_SIZES:
        step = fsdp_step_at(world_size)
        estimate = memory.estimate(step) if step is not None else None
        if estimate is not None and needed_bytes(estimate.peak) <= total:
            return world_size, estimate
    return None


def sharding_advice(memory: TrainingMemory, step: Step, total: int, gpu: str,
                    fsdp_step_at: Callable[[int], Step | None], can_checkpoint: bool) -> str:
    """One line for a ``step`` that does not fit a GPU of ``total`` bytes (``gpu`` names it): its layout, what it
    needs, and the smallest sharded layout that fits, or, when none does up to the largest of
    :data:`SHARDED_WORLD_SIZES`, what to change instead. Hybrid sharding on nodes of n GPUs fits where full sharding
    on n does: it divides the state as much, over as many GPUs or more (no more accumulation): it is named too."""
    needs = needed_bytes(memory.estimate(step).peak)
    layout = step.data_parallel if step.data_parallel == "ddp" else f"{step.data_parallel} over {step.shards} GPU(s)"
    head = f"does not fit with {layout} on {gpu} (needs {needs / GiB:.1f} GiB per GPU)"
    found = smallest_sharded_layout(memory, fsdp_step_at, total)
    if found is not None:
        world_size, estimate = found
        hybrid = (f", or with hybrid sharding (--data-parallel hsdp) on nodes of ≥ {world_size} GPUs"
                  if world_size <= 8 else "")
        return (f"{head}; fits with full sharding (--data-parallel fsdp) on ≥ {world_size} GPUs "
                f"({needed_bytes(estimate.peak) / GiB:.1f} GiB per GPU){hybrid}")
    tried = [n for n in SHARDED_WORLD_SIZES if fsdp_step_at(n) is not None]
    largest = tried[-1] if tried else 1
    last = fsdp_step_at(largest)
    notes = [f"still {needed_bytes(memory.estimate(last).peak) / GiB:.1f} GiB per GPU"] if last else []
    if largest < SHARDED_WORLD_SIZES[-1]:
        notes.append("the most GPUs the global batch splits over: --grow-global-batch true lets it grow")
    change = "a smaller --per-rank-batch-size" + (
        ", --activation-checkpointing true" if can_checkpoint and not step.activation_checkpointing else "")
    return (f"{head}; nor with full sharding on up to {largest} GPUs ({'; '.join(notes)}): sharding divides the "
            f"weights, gradients and AdamW state, not the activations; use {change}, or a GPU with more memory")
