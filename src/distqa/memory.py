"""The memory check's task-neutral half: the settings of a training step that memory depends on (:class:`Step`),
an estimate of one step's peak (:class:`StepMemory`), what a task's estimate offers (:class:`TrainingMemory`, what
``Task.training_memory`` returns), what a GPU must have besides the tensors, and the fixes when a step does not
fit. The doctor uses it; a task brings the estimate (a transformers encoder's: ``encoders/memory.py``).
No torch here.
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


GPU_MEMORY_BYTES = ((24.1e9, "L4 or A10G (24 GB)"), (42.3e9, "A100 40GB"), (85.0e9, "A100 80GB or H100 80GB"),
                    (150.0e9, "H200 (141 GB)"))
"""The bf16 GPUs distqa.throughput knows, smallest first, with the memory torch reports for them
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
