"""The distributed runtime: torchrun's environment → ranks, device and backend, process group lifetime.

torchrun (locally, in a platform job, or under Slurm) exports ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node rank), ``MASTER_ADDR`` and
``MASTER_PORT``. Without torchrun none of them is set and the run is a single process with no process
group at all, so the same code serves a notebook, a debugger and a 64-GPU job.

Device and backend are chosen together, here and nowhere else: CUDA + NCCL when GPUs are present and
allowed (``LOCAL_RANK`` picks the GPU), otherwise CPU + gloo.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distqa.config import ConfigError

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The distqa package's folder: the frames of a failed collective's traceback inside it are the caller's."""


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job and what it computes on."""

    rank: int
    """Global rank over all nodes, 0 .. world_size-1. Rank 0 writes shared files (:attr:`is_main_process`)."""
    local_rank: int
    """Rank within this node; picks the GPU."""
    world_size: int
    """Number of training processes over all nodes."""
    local_world_size: int
    """Processes on this node."""
    node_rank: int
    """Index of this node (torchrun's GROUP_RANK)."""
    device: torch.device
    backend: str
    """'nccl' with CUDA, 'gloo' on CPU."""

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        """Global rank 0: the only rank that writes shared files (checkpoints, TensorBoard, submission)."""
        return self.rank == 0


def read_torchrun_env(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Ranks from torchrun's variables; a process not launched by torchrun is rank 0 of 1."""
    environ = os.environ if environ is None else environ
    defaults = {"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 1, "LOCAL_WORLD_SIZE": 1, "GROUP_RANK": 0}
    ranks = {}
    for name, default in defaults.items():
        raw = environ.get(name)
        try:
            ranks[name] = default if raw is None else int(raw)
        except ValueError:
            raise ConfigError(f"environment variable {name}={raw!r} is not an integer; it is set by "
                              "torchrun — launch with torchrun instead of setting it by hand.") from None
    if not 0 <= ranks["RANK"] < ranks["WORLD_SIZE"]:
        raise ConfigError(f"RANK={ranks['RANK']} is outside 0..WORLD_SIZE-1 (WORLD_SIZE="
                          f"{ranks['WORLD_SIZE']}); launch with torchrun.")
    if ranks["WORLD_SIZE"] > 1 and not {"MASTER_ADDR", "MASTER_PORT"} <= environ.keys():
        raise ConfigError("WORLD_SIZE > 1 but MASTER_ADDR/MASTER_PORT are not set; launch with "
                          "torchrun, which sets them.")
    return ranks


def choose_device(requested: str, local_rank: int) -> tuple[torch.device, str]:
    """The one place that pairs a device with its collective backend."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        raise ConfigError("device=cuda but no CUDA GPU is visible; use --device auto or cpu.")
    if requested == "cpu" or not cuda:
        return torch.device("cpu"), "gloo"
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPUs are "
                          "visible; set --nproc-per-node to at most the number of GPUs.")
    return torch.device("cuda", local_rank), "nccl"


@contextmanager
def distributed_runtime(device: str = "auto", timeout_s: int = 600,
                        environ: Mapping[str, str] | None = None) -> Iterator[Runtime]:
    """Join the process group for the duration of the block (nothing to join at world size 1).

    The group is destroyed in ``finally``, so a failing rank leaves promptly instead of holding its
    peers until the collective timeout.
    """
    ranks = read_torchrun_env(environ)
    torch_device, backend = choose_device(device, ranks["LOCAL_RANK"])
    runtime = Runtime(rank=ranks["RANK"], local_rank=ranks["LOCAL_RANK"], world_size=ranks["WORLD_SIZE"],
                      local_world_size=ranks["LOCAL_WORLD_SIZE"], node_rank=ranks["GROUP_RANK"],
                      device=torch_device, backend=backend)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    try:
        if runtime.is_distributed:
            join_process_group(runtime, timeout_s)
        yield runtime
        if runtime.is_distributed and runtime.backend == "gloo":  # the block ended well on this rank
            leave_together()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


LEAVE_TOGETHER_S = 60
"""How long a rank that ended well waits at the exit for the others (:func:`leave_together`)."""


def leave_together() -> None:
    """Collective (gloo). Return once every rank has got here, or after :data:`LEAVE_TOGETHER_S`: a rank that tears
    its gloo groups down while a peer's gloo threads still work on theirs can end that peer with SIGABRT at exit
    ("terminate called without an active exception": FSDP on 2 CPU ranks, about one run in fifteen on a busy
    machine). A peer that failed instead never arrives (its agent stops this rank first, or the wait ends)."""
    with contextlib.suppress(RuntimeError):
        dist.monitored_barrier(timeout=timedelta(seconds=LEAVE_TOGETHER_S), wait_all_ranks=True)


def join_process_group(runtime: Runtime, timeout_s: int) -> None:
    """``init_process_group`` with ``runtime``'s backend and device, from torchrun's environment; the caller
    destroys the group. :func:`distributed_runtime` calls it at world size > 1 (bench/gpu_startup.py times it)."""
    dist.init_process_group(
        backend=runtime.backend, timeout=timedelta(seconds=timeout_s),
        # Binding the group to this GPU lets NCCL connect eagerly and avoids a guessed device.
        device_id=runtime.device if runtime.backend == "nccl" else None,
    )


def local_runtime(device: str = "auto") -> Runtime:
    """This process alone, with no process group: for notebooks and single-process tools."""
    torch_device, backend = choose_device(device, local_rank=0)
    return Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, device=torch_device,
                   backend=backend)


def on_device(batch: Mapping[str, torch.Tensor], device: torch.device,
              names: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """The columns ``names`` (default: all) of a batch on ``device`` (asynchronous from pinned memory)."""
    return {name: batch[name].to(device, non_blocking=True) for name in (names or tuple(batch))}


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean of ``value`` over all ranks (the value itself in a single process)."""
    if not dist.is_initialized():
        return value
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return value / dist.get_world_size()


def all_reduce_max(value: int, device: torch.device) -> int:
    """The largest of every rank's ``value`` (the value itself in a single process)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_gather_tensor(value: torch.Tensor) -> torch.Tensor:
    """Every rank's ``value`` (same shape on all ranks) stacked in rank order: shape (world_size, *value.shape)."""
    if not dist.is_initialized():
        return value.unsqueeze(0)
    gathered = [torch.empty_like(value) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, value)
    return torch.stack(gathered)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (a one-element list in a single process)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def gather_objects_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0, None on the others (a one-element list in a single process):
    what each rank other than 0 sends and receives does not grow with the world size, unlike
    :func:`all_gather_objects`, so this is the gather for what only rank 0 logs or writes."""
    if not dist.is_initialized():
        return [obj]
    main = dist.get_rank() == 0
    gathered: list[Any] | None = [None] * dist.get_world_size() if main else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank, so all ranks act on one decision."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def node_local_group(runtime: Runtime, timeout_s: float) -> tuple[dist.ProcessGroup | None, int]:
    """Collective. A gloo group of this node's ranks (host memory, whatever the training backend), and the
    global rank of the node's first rank, which acts for the node; no group (None) in a single process or
    where every node runs one rank. Nodes are told apart by torchrun's ``GROUP_RANK`` (``node_rank``)."""
    if not dist.is_initialized():
        return None, runtime.rank
    ranks_of_node: dict[int, list[int]] = {}
    for rank, node in enumerate(all_gather_objects(runtime.node_rank)):
        ranks_of_node.setdefault(node, []).append(rank)
    first = ranks_of_node[runtime.node_rank][0]
    if all(len(ranks) == 1 for ranks in ranks_of_node.values()):
        return None, first
    group, _ = dist.new_subgroups_by_enumeration(list(ranks_of_node.values()), timeout=timedelta(seconds=timeout_s),
                                                 backend="gloo")
    return group, first


def broadcast_buffer(buffer: Any, src: int, group: dist.ProcessGroup) -> None:
    """The bytes of global rank ``src``'s ``buffer`` into ``buffer`` on every rank of ``group`` (a writable
    buffer of the same size on each, such as an anonymous ``mmap``): gloo's binomial tree, so ``src`` sends
    at most log2(ranks) copies."""
    dist.broadcast(torch.frombuffer(buffer, dtype=torch.uint8), src=src, group=group)


# What gloo raises on a rank whose collective waited dist_timeout_s for a peer (third_party/gloo/gloo/
# transport/tcp/unbound_buffer.cc). NCCL does not raise: its watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING)
# logs "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=…)" and aborts the process,
# after dumping the flight recorder when TORCH_NCCL_DUMP_ON_TIMEOUT is set (scripts/worker.sh sets it).
GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (send|recv) operation")
TIMED_OUT_KEY = "distqa/collective-timed-out/{rank}"
PEERS_GRACE_S = 5.0
"""How long a rank that timed out waits for the others' timeouts before naming those that did not report."""


class CollectiveTimeoutError(Exception):
    """A collective waited ``dist_timeout_s`` for a peer (gloo): one line naming it and who did not arrive."""

    def __init__(self, rank: int, step: int, collective: str, timeout_s: float, world_size: int,
                 timed_out: list[int] | None) -> None:
        if timed_out is None:  # the store (hosted by rank 0's process) did not answer either
            who = "rank 0 did not answer on the process-group store it hosts either, so rank 0 is stalled or gone"
            suspects = "0"
        else:
            missing = [r for r in range(world_size) if r not in timed_out]
            suspects = ", ".join(map(str, missing)) or "none"
            who = (f"rank(s) {suspects} did not arrive (stalled, or busy outside the collective: they did not time "
                   f"out within {PEERS_GRACE_S:g} s of rank(s) {', '.join(map(str, timed_out))})" if missing else
                   "every rank timed out waiting: the collective itself stalled (network between the nodes)")
        super().__init__(
            f"rank {rank}: {collective} timed out after {timeout_s:g} s (dist_timeout_s) after optimizer step {step}; "
            f"{who}. "
            f"Check the log of rank(s) {suspects} for where it stopped (a hang, a slow data loader or disk, "
            "swapping), the network between the nodes (NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME), and raise "
            "--dist-timeout-s if a step, evaluation or checkpoint legitimately takes longer")
        self.rank, self.step, self.timed_out = rank, step, timed_out


@contextmanager
def collective_timeouts_named(runtime: Runtime, current_step: Callable[[], int]) -> Iterator[None]:
    """Turn gloo's collective timeout inside the block into a :class:`CollectiveTimeoutError` naming the
    optimizer steps done (``current_step()``), the collective, and the ranks that did not arrive. Those
    are found through the process group's store (torchrun's ``MASTER_ADDR:MASTER_PORT``, served by rank
    0's process): every rank that times out writes its key there, then waits :data:`PEERS_GRACE_S` for
    the others' keys."""
    try:
        yield
    except RuntimeError as err:
        found = GLOO_TIMEOUT.search(str(err))
        if found is None or not runtime.is_distributed:
            raise
        raise CollectiveTimeoutError(runtime.rank, current_step(), collective_of(err), int(found[1]) / 1000,
                                     runtime.world_size, _ranks_that_timed_out(runtime)) from err


def collective_of(err: BaseException) -> str:
    """Where ``err`` was raised: the innermost torch.distributed call in its traceback, else DDP's all-reduce inside
    backward."""
    frames = traceback.extract_tb(err.__traceback__)
    calls = [frame.name for frame in frames if Path(frame.filename).name == "distributed_c10d.py"]
    ours = [frame for frame in frames if PACKAGE_DIR in Path(frame.filename).resolve().parents
            and Path(frame.filename).resolve() != Path(__file__).resolve()]
    caller = f" (from {ours[-1].name}, {Path(ours[-1].filename).name}:{ours[-1].lineno})" if ours else ""
    if calls:
        return f"the collective {calls[-1]}(){caller}"
    if any(frame.name == "backward" for frame in frames):
        return f"DDP's gradient all-reduce in backward{caller}"
    return f"a collective{caller}"


def _ranks_that_timed_out(runtime: Runtime) -> list[int] | None:
    """Ranks whose collective timed out within :data:`PEERS_GRACE_S` of this one's; None when the store
    does not answer."""
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=PEERS_GRACE_S), wait_for_workers=False)
        store.set(TIMED_OUT_KEY.format(rank=runtime.rank), "1")
        deadline = time.monotonic() + PEERS_GRACE_S
        while True:
            reported = [r for r in range(runtime.world_size) if store.check([TIMED_OUT_KEY.format(rank=r)])]
            if len(reported) == runtime.world_size or time.monotonic() >= deadline:
                return reported
            time.sleep(0.25)
    except (RuntimeError, KeyError, ValueError) as err:  # DistStoreError is a RuntimeError
        log.warning("could not ask the process-group store who else timed out: %s", err)
        return None


LOG_FORMAT = "%(asctime)s [rank %(rank)s] %(levelname)s %(name)s: %(message)s"


def setup_logging(rank: int, log_file: os.PathLike[str] | str | None = None) -> None:
    """Log every rank to stderr and, when given, to its own file; each line carries the rank."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%H:%M:%S", defaults={"rank": rank}))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
