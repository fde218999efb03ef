"""Preflight checks: what each rank reports about itself, and what the ranks must agree on.

Every rank builds a :class:`RankReport` (host, device, GPUs, library versions, a hash of the installed
code and of the resolved config, and the problems it finds on its own node); :func:`disagreements` names the
ranks that differ from rank 0. ``python -m distqa.doctor`` runs all of it before a long job (plus an all-reduce and
the feature cache); :func:`check_at_training_start` runs the cheap part when training starts (milliseconds: no file
written; a broadcast of rank 0's report, an all-reduce and a gather of a few bytes per rank to rank 0, so each rank's
share stays the same at any world size).

Every problem is one line that says what to fix.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distqa.config import Config, ConfigError
from distqa.distributed.runtime import (
    Runtime,
    all_gather_objects,
    all_reduce_max,
    broadcast_object,
    gather_objects_to_main,
)
from distqa.record.rundir import versions

if TYPE_CHECKING:
    from distqa.tasks.base import Task

log = logging.getLogger(__name__)

GB = 1e9
DOCKER_DEFAULT_SHM = 64 * 2**20
"""What Docker gives a container's /dev/shm unless run with --shm-size or --ipc=host."""
IFF_UP = 0x1
"""The 'up' bit of /sys/class/net/<interface>/flags (linux/if.h)."""


@dataclass
class RankReport:
    """What one rank says about itself; picklable, so rank 0 can gather every rank's."""

    rank: int
    node_rank: int
    local_rank: int
    local_world_size: int
    world_size: int
    host: str
    device: str
    """``cuda:N`` or ``cpu``."""
    device_name: str
    """The GPU's name as CUDA gives it (``NVIDIA H100 80GB HBM3``), or ``cpu``."""
    gpu_count: int
    versions: dict[str, str | None]
    code_hash: str
    """Of the code of every package in ``code``: what the ranks compare first."""
    config_hash: str
    config: dict[str, Any]
    shm_bytes: int | None = None
    free_disk_bytes: int | None = None
    device_memory_bytes: int | None = None
    """The GPU's memory as CUDA reports it (``total_memory``); None on CPU."""
    problems: list[str] = field(default_factory=list)
    """Failed checks of this rank's node, each saying what to fix."""
    code: dict[str, PackageCode] = field(default_factory=dict)
    """distqa's and the task's package (:func:`code_packages`), file by file: what differs, when the hashes do."""
    launcher_node: str = ""
    """The node as ``scripts/worker.sh`` names it (``node 2 at 10.0.0.5``: its --node-rank and address; the
    ``WORKER_NODE`` variable), which torchrun's group rank is not after a membership change; empty outside it."""


@dataclass
class PackageCode:
    """One package's source on one rank: where it is imported from, and a digest of each file."""

    location: str
    files: dict[str, str]
    """Each .py file's path (``distqa/qa/model.py``) and SHA-256 (first 12 hex digits)."""


def code_packages(task: Task | None = None) -> list[str]:
    """The top-level packages whose code a run executes: distqa, and the package of its task (a fork's own,
    e.g. ``examples`` for ``--task examples.text_classification.task:TextClassification``)."""
    names = ["distqa"]
    if task is not None:
        names.append(type(task).__module__.split(".")[0])
    return list(dict.fromkeys(names))


def code_files(packages: Sequence[str] = ("distqa",)) -> dict[str, PackageCode]:
    """The source of each top-level package in ``packages`` as imported here: where it is imported from, and a
    SHA-256 (first 12 hex digits) of each of its .py files by path (``distqa/qa/model.py``)."""
    found = {}
    for name in packages:
        module = importlib.import_module(name)
        folders = [Path(folder) for folder in getattr(module, "__path__", [])]
        files = [(folder, path) for folder in folders for path in sorted(folder.rglob("*.py"))] or \
            [(Path(module.__file__ or "").parent, Path(module.__file__ or ""))]
        found[name] = PackageCode(
            str(folders[0] if folders else files[0][1]),
            {f"{name}/{path.relative_to(folder).as_posix()}": hashlib.sha256(path.read_bytes()).hexdigest()[:12]
             for folder, path in files})
    return found


def code_hash(code: Mapping[str, PackageCode]) -> str:
    """SHA-256 (first 12 hex digits) of :func:`code_files`' digests, paths included: one value to compare."""
    digest = hashlib.sha256()
    for package in code.values():
        for path, file_digest in package.files.items():
            digest.update(f"{path}\0{file_digest}\0".encode())
    return digest.hexdigest()[:12]


def config_hash(config: Config) -> str:
    """SHA-256 (first 12 hex digits) of the resolved config, as saved in config.json."""
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def library_versions() -> dict[str, str | None]:
    """The run's library versions (as in run.json) plus NCCL's where CUDA is there."""
    nccl = None
    if torch.cuda.is_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return versions() | {"nccl": nccl}


def rank_report(config: Config, runtime: Runtime, problems: list[str] | None = None,
                task: Task | None = None) -> RankReport:
    """This rank's report; ``problems`` are the failed checks so far (see the ``check_*`` functions); the code
    hash covers ``task``'s package too (:func:`code_packages`)."""
    cuda = runtime.device.type == "cuda"
    code = code_files(code_packages(task))
    return RankReport(
        rank=runtime.rank, node_rank=runtime.node_rank, local_rank=runtime.local_rank,
        local_world_size=runtime.local_world_size, world_size=runtime.world_size, host=socket.gethostname(),
        device=str(runtime.device), device_name=torch.cuda.get_device_name(runtime.device) if cuda else "cpu",
        gpu_count=torch.cuda.device_count() if torch.cuda.is_available() else 0, versions=library_versions(),
        code_hash=code_hash(code), config_hash=config_hash(config), config=config.to_dict(), code=code,
        device_memory_bytes=torch.cuda.get_device_properties(runtime.device).total_memory if cuda else None,
        problems=list(problems or []), launcher_node=os.environ.get("WORKER_NODE", ""))


# --- checks of one node: each returns the problems it found, [] when fine ------------------------------

def check_shm(path: Path, min_bytes: int, needed_for: str) -> tuple[int | None, list[str]]:
    """Size of the shared-memory filesystem at ``path`` and whether it holds ``min_bytes``."""
    try:
        size = shutil.disk_usage(path).total
    except OSError as err:
        return None, [f"shared memory {path}: {err.strerror}; {needed_for} need it (mount a tmpfs there)"]
    if size >= min_bytes:
        return size, []
    docker = " (Docker's default)" if size <= DOCKER_DEFAULT_SHM else ""
    return size, [f"shared memory {path} holds {size / 2**20:.0f} MiB{docker}, less than {min_bytes / GB:g} GB; "
                  f"{needed_for} need it: run the container with --shm-size=16g or --ipc=host (platform: a "
                  "preset with more memory), or set num_workers 0"]


def check_results_dir(directory: Path, min_free_bytes: int, write: bool = True) -> tuple[int | None, list[str]]:
    """Free space under the results directory and (``write``) that a file can be written there."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(existing).free
    problems = []
    if write:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-") as probe:
                probe.write(b"distqa doctor")
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as err:
            problems.append(f"results directory {directory} is not writable ({err.strerror}); set output_dir "
                            "(DISTQA_OUTPUT_DIR) to a writable folder, or fix the mount's owner/permissions")
    if free < min_free_bytes:
        problems.append(f"results directory {directory}: {free / GB:.1f} GB free on its disk, less than "
                        f"{min_free_bytes / GB:g} GB; free space there or point output_dir elsewhere")
    return free, problems


def check_interfaces(environ: Mapping[str, str]) -> list[str]:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name interfaces that exist here and are up.

    NCCL reads a comma-separated list of prefixes (``eth`` matches eth0), ``=`` in front for exact
    names and ``^`` to exclude (NCCL's "Environment Variables" docs, NCCL_SOCKET_IFNAME); gloo takes
    exact names, comma-separated (torch's ``ProcessGroupGloo`` create_device per name).
    """
    present = {name: _is_up(name) for _, name in socket.if_nameindex()}
    # Up interfaces first; a Kubernetes node's dozens of veth* would make the line unreadable past a dozen.
    ordered = sorted(present.items(), key=lambda item: (not item[1], item[0]))
    listing = ", ".join(f"{n} ({'up' if up else 'down'})" for n, up in ordered[:12])
    listing += f" and {len(ordered) - 12} more" if len(ordered) > 12 else ""
    problems = []
    for variable, exact in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        value = environ.get(variable, "").strip()
        if not value or (not exact and value.startswith("^")):  # unset, or NCCL told what to avoid only
            continue
        whole = exact or value.startswith("=")
        wanted = [w.strip() for w in value.lstrip("=").split(",") if w.strip()]
        matching = [n for n in present for w in wanted if (n == w if whole else n.startswith(w))]
        if not matching:
            problems.append(f"{variable}={value} names no interface of this host (it has {listing}); set it to "
                            "the interface on the network between the nodes, or unset it")
        elif not any(present[n] for n in matching):
            problems.append(f"{variable}={value}: {', '.join(matching)} exist but are down (this host has {listing}); "
                            "name an interface that is up")
    return problems


def check_rendezvous(environ: Mapping[str, str]) -> list[str]:
    """MASTER_ADDR (set by torchrun, or for a later run) resolves, and MASTER_PORT is a port number."""
    problems = []
    address, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if address:
        try:
            socket.getaddrinfo(address, None)
        except OSError:
            problems.append(f"MASTER_ADDR={address} does not resolve on this host; use node 0's address as this "
                            "node reaches it (platform: its internal hostname, Slurm: the first host of the "
                            "allocation), and check this node's DNS")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        problems.append(f"MASTER_PORT={port} is not a TCP port number (1..65535)")
    return problems


def _is_up(interface: str) -> bool:
    try:
        return bool(int(Path(f"/sys/class/net/{interface}/flags").read_text(), 16) & IFF_UP)
    except (OSError, ValueError):
        return True  # no sysfs (not Linux): existence is all we can check


# --- what the ranks must agree on -------------------------------------------------------------------

def disagreements(reports: list[RankReport], expected_world_size: int = 0) -> list[str]:
    """What the ranks do not agree on: a world size other than expected, and code, config or library
    versions that differ from rank 0's (each named with the rank, its host and what to do)."""
    first = reports[0]
    problems = []
    if len(reports) != first.world_size:
        problems.append(f"{len(reports)} ranks reported, WORLD_SIZE is {first.world_size}")
    if expected_world_size and first.world_size != expected_world_size:
        problems.append(f"world size is {first.world_size}, expected {expected_world_size}: check --nnodes and "
                        "--nproc-per-node on every node (and that every node joined)")
    for report in reports[1:]:
        problems += differences(first, report)
    return problems


def differences(first: RankReport, report: RankReport) -> list[str]:
    """What ``report``'s rank does not agree with ``first`` (rank 0's report) on, each line naming it and what to do."""
    where = f"rank {report.rank} ({report.host})"
    problems = []
    if report.world_size != first.world_size:
        problems.append(f"{where} has WORLD_SIZE {report.world_size}, rank 0 {first.world_size}")
    if report.code_hash != first.code_hash:
        problems.append(f"{where} runs other code than rank 0 ({first.host}): {code_difference(first, report)}")
    if report.config_hash != first.config_hash:
        changed = [f"{name} {first.config.get(name)!r} on rank 0, {value!r} here"
                   for name, value in report.config.items() if first.config.get(name) != value]
        what = f": {'; '.join(changed)}" if changed else " (or none: see its configuration error)"
        problems.append(f"{where} resolved another config than rank 0{what}; give every node the same preset, "
                        ".env, DISTQA_* variables and flags")
    differing = [f"{name} {value} (rank 0: {first.versions.get(name)})"
                 for name, value in report.versions.items() if first.versions.get(name) != value]
    if differing:
        problems.append(f"{where} has other library versions: {', '.join(differing)}; install the pinned "
                        "requirements.txt (or the same image) on every node")
    return problems


def code_difference(first: RankReport, other: RankReport) -> str:
    """Which packages of ``other`` differ from ``first``'s (rank 0's), from where each imports them, the first file
    that differs, and what to do: one node with its own copy on one host, other code on another host."""
    differing = []
    for name in sorted(first.code.keys() | other.code.keys()):
        mine, theirs = first.code.get(name), other.code.get(name)
        if mine is None or theirs is None:
            differing.append(f"package {name} is {'not ' if mine is None else ''}part of rank 0's run"
                             f"{'' if mine is None else ' only'}")
            continue
        paths = sorted(mine.files.keys() | theirs.files.keys())
        changed = [path for path in paths if mine.files.get(path) != theirs.files.get(path)]
        if not changed:
            continue
        first_path = changed[0]
        how = ("changed" if first_path in mine.files and first_path in theirs.files
               else "only on rank 0" if first_path in mine.files else f"only on rank {other.rank}")
        more = f" and {len(changed) - 1} more file{'s' if len(changed) > 2 else ''}" if len(changed) > 1 else ""
        where = (f"imported from {theirs.location} on rank {other.rank}, {mine.location} on rank 0"
                 if theirs.location != mine.location else f"imported from {mine.location} on both")
        differing.append(f"package {name} differs in {first_path} ({how}){more}, {where}")
    what = "; ".join(differing) or "the same files, another hash (report this)"
    if first.host == other.host:
        advice = ("both run on this host: start every node from the same checkout with the same PYTHONPATH "
                  "(python -c 'import distqa; print(distqa.__file__)' says which copy a node imports)")
    else:
        advice = ("give every node the same version of that code: the same commit, the same image, and on the "
                  "platform the same `neuro-flow upload code`")
    return f"{what}; {advice}"


def node_problems(reports: list[RankReport]) -> list[str]:
    """Each rank's own problems, named with its rank and host; a problem several ranks share is one line."""
    by_problem: dict[str, list[RankReport]] = {}
    for report in reports:
        for problem in report.problems:
            by_problem.setdefault(problem, []).append(report)
    lines = []
    for problem, having in by_problem.items():
        hosts = sorted({report.host for report in having})
        shown_hosts = ", ".join(hosts[:4]) + (f" and {len(hosts) - 4} more hosts" if len(hosts) > 4 else "")
        ranks = ", ".join(str(report.rank) for report in having[:8]) + (" …" if len(having) > 8 else "")
        lines.append(f"rank{'s' if len(having) > 1 else ''} {ranks} ({shown_hosts}): {problem}")
    return lines


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: what rank 0 needs of every rank to name it in the log (a straggler, the membership)."""

    host: str
    node_rank: int
    launcher_node: str
    """:attr:`RankReport.launcher_node`."""


def check_at_training_start(config: Config, runtime: Runtime, task: Task | None = None) -> list[RankPlace]:
    """The cheap preflight of every training run, on every rank; returns every rank's place on rank 0, in rank order
    (an empty list on the others).

    Ranks that differ in code, config or library versions would train a different model on each rank (or hang in
    a collective), so every rank raises the same :class:`ConfigError`. What each rank sends and receives stays the
    same at any world size: rank 0 broadcasts its report, each rank compares its own with it, and one all-reduce
    says whether any differs; only then (a run that stops here) does every rank gather every report, so that each
    raises the same lines. Rank 0 gathers the ranks' places, a few bytes each. Problems of a node (shared memory
    for the loader's workers, free disk) are logged as warnings by the rank that has them. Nothing is written and
    no random number is drawn.
    """
    local = []
    if config.num_workers > 0:
        local += check_shm(Path("/dev/shm"), DOCKER_DEFAULT_SHM * 8, "DataLoader workers (num_workers > 0)")[1]
    local += check_results_dir(config.run_dir, int(GB), write=False)[1]
    for problem in local:
        log.warning("preflight: %s", problem)
    report = rank_report(config, runtime, local, task)
    first = broadcast_object(report)
    if all_reduce_max(int(bool(differences(first, report))), runtime.device):
        mismatches = disagreements(all_gather_objects(report))
        raise ConfigError("the ranks of this run disagree:\n  " + "\n  ".join(mismatches) +
                          "\n(`python -m distqa.doctor` through the same launcher checks a cluster before a run)")
    places = gather_objects_to_main(RankPlace(report.host, report.node_rank, report.launcher_node)) or []
    if runtime.is_main_process:
        log.info("preflight: %d ranks on %d nodes agree on code %s, config %s, torch %s", len(places),
                 len({place.node_rank for place in places}), first.code_hash, first.config_hash,
                 first.versions["torch"])
    return places
