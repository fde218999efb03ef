"""Preflight doctor: every rank reports, rank 0 checks the cluster and says what to fix.

Run it before a long job, with the same launcher, settings and environment as the job itself.
One process (this machine, one GPU)::

    python -m distqa.doctor --preset NAME

One node, all its GPUs::

    torchrun --standalone --nproc-per-node gpu -m distqa.doctor --preset NAME

Every node of a multi-node job (the same command line as the run's, with ``--doctor``)::

    scripts/worker.sh --doctor --nnodes 2 --node-rank 0 --run-id my-run -- --preset NAME
    scripts/worker.sh --doctor --nnodes 2 --node-rank 1 --master-addr HOST0 --run-id my-run -- --preset NAME

It takes every setting ``python -m distqa.train`` takes (the config it checks is the run's) plus the
flags in the "doctor" group of ``--help``. Rank 0 prints one table (a row per rank: host, device, GPUs,
library versions, code and config hashes, /dev/shm, free disk), the all-reduce bandwidth, then one line
per failed check saying what to fix. Checks: the world size (``--expect-world-size``); the same code
(distqa and the task's package), config and library versions on every rank; an all-reduce of
``--allreduce-mb`` with its result checked and its bandwidth measured; /dev/shm size; free disk and
writability of the results directory, and every rank seeing the file rank 0 writes there (storage
every node mounts); what the task reads (its ``check_inputs``: the model's sources, a
feature cache); MASTER_ADDR resolving; NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME naming
interfaces that exist and are up; the estimated peak memory of a training step against each rank's GPU
(``--gpu-memory-gb`` checks it against a GPU of that size, also from a CPU machine) for the run's
``data_parallel`` layout, with the fixes when it does not fit, and one line naming the smallest sharded layout
that fits (the task's ``training_memory``, checked by :mod:`distqa.tasks.step_memory`).

Exit status: 0 when every check passed, 1 when one failed (every rank exits so, and torchrun with it),
2 for a setting that is wrong in itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from dotenv import load_dotenv

from distqa.config import Config, ConfigError
from distqa.config.errors import DataError, print_error
from distqa.config.flags import build_arg_parser
from distqa.config.sources import SettingSources, dotenv_file, load_config
from distqa.distributed.elastic import NodeRange, range_report
from distqa.distributed.precision import Precision
from distqa.distributed.runtime import Runtime, all_gather_objects, broadcast_object, distributed_runtime, setup_logging
from distqa.tasks import make_task, task_class
from distqa.tasks.base import Task
from distqa.tasks.step_memory import GiB, Step, fixes, needed_bytes, sharding_advice, shards_of, smallest_sharded_layout
from distqa.training.preflight import (
    GB,
    RankReport,
    check_interfaces,
    check_rendezvous,
    check_results_dir,
    check_shm,
    disagreements,
    node_problems,
    rank_report,
)

PROG = "python -m distqa.doctor"
FAILED_EXIT_CODE = 1
log = logging.getLogger("distqa.doctor")


def add_doctor_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The doctor's own flags (the run's settings are parsed by :func:`distqa.config.sources.load_config`)."""
    group = parser.add_argument_group("doctor")
    group.add_argument("--expect-world-size", type=int, default=0, metavar="N",
                       help="Fail unless the job has N ranks (nodes × processes per node); 0 = no expectation.")
    group.add_argument("--allreduce-mb", type=float, default=0, metavar="MB",
                       help="Size of the all-reduce smoke test in MB (float32); 0 = 256 on GPUs, 16 on CPU.")
    group.add_argument("--min-bandwidth-gbs", type=float, default=0, metavar="GB/S",
                       help="Fail when the all-reduce's bus bandwidth is below this (GB/s); 0 = report only.")
    group.add_argument("--shm-path", type=Path, default=Path("/dev/shm"), metavar="PATH",
                       help="The shared-memory filesystem DataLoader workers and NCCL use (default /dev/shm).")
    group.add_argument("--min-shm-gb", type=float, default=1.0, metavar="GB",
                       help="Fail when the shared memory is smaller than this (GB; Docker's default is 0.067).")
    group.add_argument("--min-free-disk-gb", type=float, default=5.0, metavar="GB",
                       help="Fail when the results directory's disk has less free space than this (GB).")
    group.add_argument("--timeout-s", type=int, default=120, metavar="S",
                       help="Seconds a collective of the doctor may wait for the other ranks.")
    group.add_argument("--gpu-memory-gb", type=float, default=0, metavar="GB",
                       help="Check the estimated memory of a training step against a GPU of this many GB (10^9 bytes, "
                            "as nvidia-smi's total: 24 for an L4, 85 for an 80 GB H100) instead of each rank's own; "
                            "on a CPU machine, as if the run had such GPUs. 0 = each rank's GPU (none on CPU).")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    load_dotenv(dotenv_file(), override=False)  # as train does: .env may set NCCL_*, MASTER_ADDR, DISTQA_*
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        try:
            task = task_class(SettingSources.read(argv, os.environ, None).task)
        except ConfigError as err:
            print_error(f"distqa.doctor: configuration error: {err}")
            return 2
        add_doctor_flags(build_arg_parser(PROG, task, description=__doc__.split("\n")[0])).print_help()
        return 0
    options, run_argv = add_doctor_flags(argparse.ArgumentParser(add_help=False, allow_abbrev=False)
                                         ).parse_known_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(rank)
    config_error, task = None, None
    try:
        config = load_config(run_argv, prog=PROG)
        task = make_task(config)
    except ConfigError as err:
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            print_error(f"distqa.doctor: configuration error: {err}")
            return 2
        # The other ranks would wait for this one until the timeout: join them, and let rank 0 report it.
        config, config_error = Config(), f"configuration error: {err}"
        log.error("%s", config_error)
    # Checked before the process group exists: a wrong interface name would make its creation fail.
    early = check_rendezvous(os.environ) + check_interfaces(os.environ)
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if any(problem.startswith(variable) for problem in early):
            log.warning("%s is wrong (see the report); the doctor's own group runs without it", variable)
            os.environ.pop(variable)
    with distributed_runtime(config.device, options.timeout_s) as runtime:
        failed = run_checks(config, runtime, options, early, task, config_error)
    return FAILED_EXIT_CODE if failed else 0


def run_checks(config: Config, runtime: Runtime, options: argparse.Namespace, early: list[str],
               task: Task | None = None, config_error: str | None = None) -> bool:
    """Every check on every rank; rank 0 prints the table and the problems. True when one failed.

    With ``config_error`` (this rank's settings are wrong, ``config`` is a stand-in, ``task`` None) the checks
    that depend on the settings are skipped and the error is this rank's problem."""
    problems = list(early) + ([config_error] if config_error else [])
    workers = "DataLoader workers (num_workers > 0)" if config.num_workers else ""
    nccl_peers = "NCCL between GPUs of one node" if runtime.backend == "nccl" and runtime.local_world_size > 1 else ""
    users = " and ".join(filter(None, [workers, nccl_peers]))
    shm_size, shm_problems = check_shm(options.shm_path, int(options.min_shm_gb * GB), users)
    if users and not config_error:  # otherwise nothing of the run uses it: its size is only shown
        problems += shm_problems
    free, disk_problems = check_results_dir(config.run_dir, int(options.min_free_disk_gb * GB),
                                            write=not config_error)
    problems += [] if config_error else disk_problems
    shared_probe, shared_problems = check_results_shared(config.run_dir, runtime, look=not config_error)
    problems += shared_problems
    if task is not None and not config_error:
        try:  # what the run reads, without building anything (a cache must be built before launch)
            task.check_inputs(may_build=False)
        except (ConfigError, DataError) as err:
            problems.append(str(err))
    if runtime.device.type == "cuda" and runtime.local_world_size < torch.cuda.device_count():
        problems.append(f"{runtime.local_world_size} processes on a node with {torch.cuda.device_count()} GPUs: "
                        "some GPUs would idle; use --nproc-per-node gpu")
    report = rank_report(config, runtime, problems, task)
    report.shm_bytes, report.free_disk_bytes = shm_size, free
    if config_error:  # the stand-in config's hash and results folder say nothing about the run
        report.config_hash, report.config, report.free_disk_bytes = "invalid", {}, None
    reports: list[RankReport] = all_gather_objects(report)
    if shared_probe is not None:  # every rank has looked for it: the gather above came after
        shared_probe.unlink(missing_ok=True)
    bandwidth, bandwidth_problems = allreduce_smoke_test(runtime, options.allreduce_mb, options.min_bandwidth_gbs)
    failures = []
    if runtime.is_main_process:
        memory = check_memory(config, runtime, reports, task, options.gpu_memory_gb) if task and not config_error \
            else "memory: not estimated (no valid settings)"
        nodes, range_problems = range_report(config, NodeRange.from_environment()) if not config_error \
            else ("nodes: not checked (no valid settings)", [])
        failures = disagreements(reports, options.expect_world_size) + bandwidth_problems + node_problems(reports) \
            + range_problems
        print(format_table(reports), flush=True)
        print(bandwidth, flush=True)
        print(memory, flush=True)
        print(nodes, flush=True)
        for failure in failures:
            print(f"FAIL {failure}", flush=True)
        print(f"doctor: {len(failures)} problem(s)" if failures else
              f"doctor: all checks passed on {len(reports)} rank(s)", flush=True)
    return bool(broadcast_object(bool(failures)))


def check_results_shared(directory: Path, runtime: Runtime, look: bool = True) -> tuple[Path | None, list[str]]:
    """Collective. Whether this rank sees the file rank 0 has just written in the results directory: checkpoints,
    the feature cache and the run's files must be on storage every node mounts (a ReadWriteMany volume on
    Kubernetes, the platform's storage, a shared file system), or each node resumes from its own files. A mount
    that caches (a bucket mounted with a cache) may show it late: that fails too. Returns the file (rank 0, which
    removes it once every rank has looked) and this rank's problems. ``look`` False: take part, report nothing."""
    probe, token = None, ""
    if runtime.is_main_process and look and runtime.is_distributed:
        try:
            probe = directory / f".doctor-shared-{uuid.uuid4().hex}"
            token = uuid.uuid4().hex
            directory.mkdir(parents=True, exist_ok=True)
            probe.write_text(token)
        except OSError:  # check_results_dir reports an unwritable directory
            probe, token = None, ""
    name, token = broadcast_object((probe.name if probe else "", token))
    if not token or not look or runtime.is_main_process:
        return probe, []
    try:
        seen = (directory / name).read_text() == token
    except OSError:
        seen = False
    return None, [] if seen else [
        f"results directory {directory} is not the one rank 0 sees: the file rank 0 wrote there is not here; put "
        "output_dir (DISTQA_OUTPUT_DIR) on storage every node mounts (a ReadWriteMany volume on Kubernetes, a shared "
        "file system), or each node resumes from checkpoints of its own"]


def allreduce_smoke_test(runtime: Runtime, size_mb: float, min_bus_gbs: float,
                         repeats: int = 5) -> tuple[str, list[str]]:
    """All-reduce (sum) of ``size_mb`` MB of float32 over every rank, checked and timed.

    Bandwidths as nccl-tests defines them: algorithm bandwidth = bytes / time, bus bandwidth = that ×
    2(n-1)/n (what each link carries in a ring; comparable across world sizes). Median of ``repeats``
    after one warm-up."""
    if not runtime.is_distributed:
        return "all-reduce: not run (world size 1)", []
    size_mb = size_mb or (256 if runtime.device.type == "cuda" else 16)
    elements = max(1, int(size_mb * 1e6 / 4))
    tensor = torch.empty(elements, dtype=torch.float32, device=runtime.device)
    times = []
    for attempt in range(repeats + 1):
        tensor.fill_(runtime.rank + 1)
        _synchronize(runtime)
        started = time.perf_counter()
        dist.all_reduce(tensor)
        _synchronize(runtime)
        if attempt:  # the first one sets up connections and buffers
            times.append(time.perf_counter() - started)
    n = runtime.world_size
    expected = n * (n + 1) / 2
    problems = []
    if not torch.all(tensor == expected):
        problems.append(f"all-reduce returned wrong sums (expected {expected:g} everywhere): a broken transport; "
                        "rerun with NCCL_DEBUG=INFO and check the interfaces")
    seconds = statistics.median(times)
    size_bytes = elements * 4
    algorithm, bus = size_bytes / seconds / GB, size_bytes / seconds / GB * 2 * (n - 1) / n
    if min_bus_gbs and bus < min_bus_gbs:
        problems.append(f"all-reduce bus bandwidth {bus:.2f} GB/s is below --min-bandwidth-gbs {min_bus_gbs:g}: "
                        "check the interface NCCL uses (NCCL_DEBUG=INFO, NCCL_SOCKET_IFNAME) and InfiniBand")
    summary = (f"all-reduce {size_bytes / 1e6:.0f} MB float32 over {n} ranks ({runtime.backend}): "
               f"{1000 * seconds:.1f} ms median of {repeats}, algorithm bandwidth {algorithm:.2f} GB/s, "
               f"bus bandwidth {bus:.2f} GB/s")
    return summary, problems


def check_memory(config: Config, runtime: Runtime, reports: list[RankReport], task: Task, gpu_memory_gb: float) -> str:
    """Rank 0: the estimated peak of one training step per rank with the run's data-parallel layout, as one line;
    each rank whose GPU (or the GPU of ``gpu_memory_gb``) it does not fit gets a problem naming the fixes (added to
    its report's problems), and a second line names the smallest sharded layout that fits the smallest of them."""
    try:
        memory = task.training_memory()
    except ConfigError as err:  # the model's config cannot be read here (an encoder's hub name without network)
        reports[0].problems.append(f"memory: cannot estimate it: {err}")
        return "memory: not estimated"
    except ValueError as err:  # a model the task's estimate cannot read its sizes from
        return f"memory: not estimated ({err})"
    if memory is None:
        return f"memory: not estimated (task {task.name or config.task!r} defines no training_memory)"
    gpu = gpu_memory_gb > 0 or any(report.device_memory_bytes for report in reports)
    if config.precision != "auto":
        precision = config.precision
    elif runtime.device.type == "cuda":  # bf16, or fp16 where the GPU has no bf16: the same bytes
        precision = Precision.choose("auto", runtime.device).name
    else:  # auto is fp32 on CPU; the GPU of --gpu-memory-gb is taken to have bf16
        precision = "bf16" if gpu else "fp32"
    world_size = runtime.world_size
    accumulation = config.for_world_size(world_size).accumulation_steps(world_size)
    checkpointing = getattr(config, "activation_checkpointing", None)  # a task's setting, if it has one
    step = Step(micro_batch=config.per_rank_batch_size, precision=precision, device_type="cuda" if gpu else "cpu",
                activation_checkpointing=bool(checkpointing), gradients_persist=world_size > 1 or accumulation > 1,
                data_parallel=config.data_parallel,
                shards=shards_of(config.data_parallel, world_size, runtime.local_world_size),
                accumulation_steps=accumulation)

    def fsdp_step_at(gpus: int) -> Step | None:
        """The run's step with full sharding on ``gpus`` GPUs; None where its shares of the global batch do not fill
        its micro-batches (:func:`_whole_micro_batches`)."""
        steps = _whole_micro_batches(config.for_world_size(gpus), gpus)
        if steps is None:
            return None
        return dataclasses.replace(step, gradients_persist=True, data_parallel="fsdp", shards=gpus,
                                   accumulation_steps=steps)

    estimate = memory.estimate(step)
    line = f"memory per rank: {estimate.describe()}, estimated for {step.layout()}, {memory.describe(step)}"
    tightest: tuple[int, str] | None = None  # the smallest GPU the step does not fit, and its name
    for report in reports:
        total = int(gpu_memory_gb * GB) if gpu_memory_gb else report.device_memory_bytes
        if total is None or needed_bytes(estimate.peak) <= total:
            continue
        where = f"a GPU of {gpu_memory_gb:g} GB (--gpu-memory-gb)" if gpu_memory_gb else "this GPU"
        remedies = fixes(memory, step, total, lambda micro_batch: _keeps_global_batch(config, micro_batch, world_size),
                         can_checkpoint=checkpointing is not None)
        sharded = smallest_sharded_layout(memory, fsdp_step_at, total)
        if sharded:  # before the last fix, a larger GPU
            remedies.insert(-1, f"--data-parallel fsdp on ≥ {sharded[0]} GPUs ({sharded[1].peak / GiB:.1f} GiB)")
        report.problems.append(
            f"memory: a training step needs about {needed_bytes(estimate.peak) / GiB:.1f} GiB (its estimated peak, "
            f"{estimate.peak / GiB:.1f} GiB, with the allocator's margin and CUDA's and NCCL's own) and {where} has "
            f"{total / GiB:.1f} GiB; fix: {', or '.join(remedies)}")
        if tightest is None or total < tightest[0]:
            tightest = (total, f"a GPU of {gpu_memory_gb:g} GB" if gpu_memory_gb else
                        f"{report.device_name} ({total / GiB:.1f} GiB)")
    if not gpu:
        line += "; --gpu-memory-gb N checks it against a GPU of N GB"
    if tightest:
        line += "\nmemory: " + sharding_advice(memory, step, *tightest, fsdp_step_at,
                                               can_checkpoint=checkpointing is not None)
    return line


def _keeps_global_batch(config: Config, micro_batch: int, world_size: int) -> bool:
    """Whether ``micro_batch`` per rank trains the run's global batch at ``world_size`` unchanged (more micro-batches
    per step instead of a batch grown by ``grow_global_batch``) in micro-batches its shares fill
    (:func:`_whole_micro_batches`)."""
    smaller = dataclasses.replace(config, per_rank_batch_size=micro_batch).for_world_size(world_size)
    return _whole_micro_batches(smaller, world_size) is not None \
        and smaller.global_batch_size == config.for_world_size(world_size).global_batch_size


def _whole_micro_batches(config: Config, world_size: int) -> int | None:
    """The accumulation at ``world_size`` where the micro-batch divides the largest share of the global batch (no
    rank computes more rows of padding than the one an uneven share needs), None otherwise: any world size up to the
    global batch can train it (Config.accumulation_steps), but the doctor advises the layouts that waste no
    micro-batch on copies."""
    try:
        accumulation = config.accumulation_steps(world_size)
    except ConfigError:
        return None
    largest_share = -(-config.global_batch_size // world_size)
    return accumulation if largest_share % config.per_rank_batch_size == 0 else None


def _synchronize(runtime: Runtime) -> None:
    if runtime.device.type == "cuda":
        torch.cuda.synchronize(runtime.device)


def format_table(reports: list[RankReport]) -> str:
    """One row per rank, columns aligned."""
    header = ["rank", "node", "host", "device", "GPUs", "torch", "transformers", "NCCL", "code", "config",
              "shm GB", "free GB", "problems"]
    rows = [[str(r.rank), str(r.node_rank), r.host, r.device_name if r.device.startswith("cuda") else r.device,
             str(r.gpu_count), r.versions["torch"] or "-", r.versions["transformers"] or "-",
             r.versions.get("nccl") or "-", r.code_hash, r.config_hash, _gb(r.shm_bytes), _gb(r.free_disk_bytes),
             str(len(r.problems))] for r in reports]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def _gb(size: int | None) -> str:
    return "-" if size is None else f"{size / GB:.1f}"


if __name__ == "__main__":
    sys.exit(main())
