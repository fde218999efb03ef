"""One node of a run, in one Python process: its options, its checks, then torchrun's agent in this process.

``scripts/worker.sh`` finds the interpreter and runs this module with its arguments (``--help``: the options, exit
statuses and environment, :mod:`distqa.launch.node_options`)::

    python -m distqa.launch.node [--nnodes N] [--node-rank I] [--master-addr HOST] ... [--] [TRAINER ARGS...]

In order: the engines' variables (:mod:`distqa.launch.engines`), the command line and project.toml's [jobs] args,
the options' checks, then what needs this machine (the entry module, the GPU count, the run
directory for the flight recorder, the node range against the global batch), the environment of the workers, the
one line that says what runs, a wait for the rendezvous store (nodes 1..N-1, or every node of an external store),
and :func:`distqa.launch.agent.main` (``torch.distributed.run.main``) in this process. torch is imported only for
the agent, and to count GPUs where a GPU driver's device node exists and --nproc-per-node was not given.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from distqa.config import ConfigError
from distqa.config.errors import WORKER_REPORT_DIR_VARIABLE
from distqa.config.sources import run_dir_of
from distqa.launch import reachability
from distqa.launch.engines import kubeflow_environment, skypilot_environment
from distqa.launch.node_options import (
    RENDEZVOUS_SETTINGS,
    USAGE,
    Node,
    NodeError,
    NodeOptions,
    check,
    parse_command_line,
    project_words,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout (src/distqa/launch/node.py): its project.toml, and the PYTHONPATH entry a fork's packages import
from, unless worker.sh names its own (:data:`CHECKOUT_VARIABLE`)."""
CHECKOUT_VARIABLE = "WORKER_CHECKOUT"
"""The checkout worker.sh was started from, as its path reads (symlinks kept): a project whose checkout is not where
distqa is installed from (a job's uploaded copy beside a shared environment) keeps its own project.toml and packages."""
STOPPED_EXIT_CODE = 75
"""The workers stopped on a signal after a checkpoint of the step reached (distqa.distributed.stop)."""
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
"""A GPU driver's device node (NVIDIA's, WSL2's, ROCm's): without one torch sees no GPU."""


def read_node(argv: Sequence[str], environ: MutableMapping[str, str], repo_root: Path = REPO_ROOT) -> Node | None:
    """The node's options from the engines' variables, the command line and (--project-args) project.toml, checked;
    None for --help. ``environ`` loses the engines' variables and gains what they pass on (see the engines)."""
    options = skypilot_environment(kubeflow_environment(NodeOptions.from_environment(environ), environ), environ)
    options = parse_command_line(argv, options)
    if options.help:
        return None
    if options.project_args:
        options.trainer_args = [*project_words(repo_root, environ), *options.trainer_args]
    return check(options, environ)


def torchrun_args(node: Node, nproc: int, node_addr: str, environ: MutableMapping[str, str]) -> list[str]:
    """The arguments of ``python -m distqa.launch.agent`` (torchrun's, after the node rank), the entry module's
    included."""
    args = [str(node.node_rank), "--nproc-per-node", str(nproc), "--max-restarts", str(node.max_restarts)]
    if node.nnodes == 1:
        args.append("--standalone")
    else:
        # Node 0 hosts the store unless it runs elsewhere (--external-store): then every agent is a client.
        conf = f"is_host={int(node.node_rank == 0 and not node.external_store)},join_timeout={node.join_timeout}"
        for key, name in RENDEZVOUS_SETTINGS.items():
            if environ.get(name):
                conf += f",{key}={environ[name]}"
        args += ["--nnodes", node_count(node), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"{node.master_addr or node_addr}:{node.master_port}", "--rdzv-id", node.run_id, "--rdzv-conf", conf,
                 "--local-addr", node_addr]
    return [*args, "-m", node.entry_module, "--run-name", node.run_id, *node.trainer_args]


def node_count(node: Node) -> str:
    """torchrun's --nnodes: N, or MIN:N for an elastic range."""
    return str(node.nnodes) if node.min_nodes == node.nnodes else f"{node.min_nodes}:{node.nnodes}"


def this_address(environ: MutableMapping[str, str]) -> str:
    """The address the other nodes reach this one at (torchrun publishes it; the node that gets group rank 0 serves
    the workers' process-group store there): NODE_ADDR, else this host's name resolved, with a warning when that is
    a loopback address."""
    if addr := environ.get("NODE_ADDR"):
        return addr
    addr = socket.gethostbyname(socket.gethostname())
    if addr.startswith("127."):
        say(f"warning: this host's name resolves to {addr}; other nodes cannot reach that. Set NODE_ADDR to this "
            "node's address.")
    return addr


def worker_environment(node: Node, nproc: int, environ: MutableMapping[str, str]) -> None:
    """What torchrun's workers find in their environment besides the agent's own variables."""
    # The node range, for the trainer's preflight and its membership lines (distributed.elastic): torchrun tells a
    # worker the node count of its round (GROUP_WORLD_SIZE), not the range.
    environ["WORKER_NODE_RANGE"] = f"{node.min_nodes}:{node.nnodes}"
    environ["WORKER_NODE"] = f"node {node.node_rank} at {environ.get('NODE_ADDR') or socket.gethostname()}"
    # Workers get a fresh TCP store each rendezvous round instead of sharing the agent's: with the shared store a
    # restarted worker can read the previous attempt's peer addresses (pytorch#135712).
    environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") or "1"
    environ["PYTHONUNBUFFERED"] = "1"
    # Each process gets its share of the node's cores instead of a thread per core (oversubscribed CPU runs are
    # several times slower); emulated nodes on one machine pass their share as NODE_CORES.
    if not environ.get("OMP_NUM_THREADS"):
        cores = int(environ.get("NODE_CORES") or len(os.sched_getaffinity(0)))  # `nproc`: the cores it may use
        environ["OMP_NUM_THREADS"] = str(max(cores // nproc, 1))


def flight_recorder(node: Node, environ: MutableMapping[str, str]) -> Path | None:
    """The run directory (the trainer's own, its settings resolved as it will resolve them), where PyTorch's flight
    recorder dumps; None when the trainer's settings are refused (the trainer reports that).

    torch 2.13 (c10d/FlightRecorder.hpp, ProcessGroupNCCL.hpp): each rank keeps its last TORCH_FR_BUFFER_SIZE
    collectives, and when NCCL's watchdog times one out (dist_timeout_s) it dumps them to
    <TORCH_FR_DUMP_TEMP_FILE><rank>: into the run directory, so a hang leaves a record of which collective each rank
    was in. Read it with `torchfrtrace <run dir>/flight-recorder` (docs/FAULT_TOLERANCE.md, "Reading the flight
    recorder"). 2.13's names; it still reads TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE, with a
    deprecation warning."""
    try:
        run_dir = run_dir_of(["--run-name", node.run_id, *node.trainer_args], environ)
    except Exception:
        return None
    dump = environ.get("TORCH_FR_DUMP_TEMP_FILE") or f"{run_dir}/flight-recorder/rank_"
    if not node.dry_run:
        Path(dump).parent.mkdir(parents=True, exist_ok=True)
    environ["TORCH_FR_DUMP_TEMP_FILE"] = dump
    environ["TORCH_FR_BUFFER_SIZE"] = environ.get("TORCH_FR_BUFFER_SIZE") or "2000"
    environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT") or "1"
    # 3 (torch's default, stated): on a timeout or NCCL error the watchdog tears the process down, so torchrun sees
    # the failure instead of a rank hanging forever.
    environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") or "3"
    return run_dir


def say(line: str) -> None:
    print(f"worker.sh: {line}", file=sys.stderr, flush=True)


@contextmanager
def stop_timer(node: Node) -> Iterator[None]:
    """--stop-after: SIGTERM to this process (torchrun's agent) after that many seconds, as the platform would."""
    if node.stop_after_s <= 0:
        yield
        return

    def stop() -> None:
        say(f"run '{node.run_id}' node {node.node_rank}: --stop-after {node.stop_after_s}s reached: asking the workers "
            "to stop")
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(node.stop_after_s, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def run_agent(args: list[str]) -> int:
    """``python -m distqa.launch.agent ARGS`` in this process, its end as an exit status. SIGTERM and SIGINT (the
    platform ending the job, Slurm's --signal, Ctrl-C, --stop-after) reach torchrun's agent as SIGTERM, which it
    sends to its workers (who stop at the next check step), SIGKILLing them after TORCH_ELASTIC_SHUTDOWN_TIMEOUT s
    (default 30); a signal before the workers start ends the agent the same way."""
    # torch for the agent alone: what comes before it (--dry-run, a refusal, the checks) never waits for its import.
    from torch.distributed.elastic.multiprocessing import api as processes

    from distqa.launch import agent  # torchrun's agent: torch too

    def stop_as_sigterm(signum: int, frame: object) -> None:  # torch's _terminate_process_handler, SIGINT as SIGTERM
        raise processes.SignalException(f"Process {os.getpid()} got signal: {signal.Signals(signum)}",
                                        sigval=signal.SIGTERM)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stop_as_sigterm)
    real_handler = processes._terminate_process_handler
    processes._terminate_process_handler = stop_as_sigterm  # what torchrun installs as it starts the workers
    try:
        return agent.main(args)
    except SystemExit as end:
        return end.code if isinstance(end.code, int) else 1
    except processes.SignalException:
        return 1  # torchrun stopped its workers on the signal (its log says so)
    except Exception:
        traceback.print_exc()  # torchrun's report, as its process would end with it
        return 1
    finally:
        processes._terminate_process_handler = real_handler
        for number in (signal.SIGTERM, signal.SIGINT):  # the agent has ended: a late signal cuts no report short
            signal.signal(number, signal.SIG_IGN)


def outcome(node: Node, status: int, reports: Path, run_dir: Path | None) -> int:
    """The node's exit status from the agent's and its workers' reports, each end said in one line."""
    where = f"run '{node.run_id}' node {node.node_rank}"
    # Workers stopped by a signal (distqa.distributed.stop: exit 75 after rank 0 wrote a checkpoint of the step
    # reached) each leave one line: torchrun itself ends with 1 whatever its workers' codes were.
    if stopped := sorted(reports.glob("rank-*")):
        say(f"{where}: {next(iter(stopped[0].read_text().splitlines()), '')}")
        return STOPPED_EXIT_CODE
    # Workers that refused to run (a configuration or data error: distqa.config.errors.report_failure) said why and left
    # exit-<CODE>-rank-<R>; distqa.launch.agent then ends with their code instead of torchrun's 1 and its traceback.
    if status != 0 and any(reports.glob(f"exit-{status}-rank-*")):
        logs = f" and in {run_dir}/logs/rank-*.log" if run_dir else ""
        say(f"{where}: the workers refused to run (exit {status}); why is above{logs}")
        return status
    # the agent's module imports torch, which is here already: the agent ran
    from distqa.launch.agent import RENDEZVOUS_TIMEOUT_EXIT_CODE

    if status not in (0, RENDEZVOUS_TIMEOUT_EXIT_CODE):  # the agent said why in one line
        say(f"{where}: torchrun exited with status {status} (see above)")
    return status


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
    """An elastic range (--min-nodes below --nnodes) whose largest world size exceeds the global batch of ``python -m
    distqa.train TRAINER_ARGS`` stops the node before any rendezvous, in one line, instead of failing (and being
    restarted) at the first membership change."""
    # Only this check needs the settings' loader (it brings the task registry in) and distqa.distributed (whose
    # package imports torch): a node of a fixed node count starts without either.
    from distqa.config.sources import load_config
    from distqa.distributed.elastic import NodeRange, check_node_range

    try:
        config = load_config(["--run-name", node.run_id, *node.trainer_args], check_data_paths=False)
        check_node_range(config, NodeRange(node.min_nodes, node.nnodes, nproc))
    except ConfigError as err:
        raise NodeError(f"configuration error: {err}") from err


def start(node: Node, environ: MutableMapping[str, str], repo_root: Path) -> int:
    """Everything after the options' checks (see the module doc); the node's exit status."""
    # A fork's packages next to src/ (a task of examples/, say) import from any directory, on every node.
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(repo_root), environ.get("PYTHONPATH"))))
    if str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))
    if not entry_module_found(node.entry_module):
        raise NodeError(f"--entry-module {node.entry_module}: no such module for {sys.executable} (PYTHONPATH has "
                        "the repository)")
    nproc = node.nproc_per_node or processes_here()
    run_dir = flight_recorder(node, environ)
    worker_environment(node, nproc, environ)
    if node.min_nodes < node.nnodes and node.entry_module == "distqa.train":
        # Before any rendezvous: a range with a world size that does not split the global batch is refused in one
        # line, instead of failing (and being restarted) at the first membership change.
        node_range_check(node, nproc)
    node_addr = this_address(environ) if node.nnodes > 1 else ""
    args = torchrun_args(node, nproc, node_addr, environ)
    if node.nnodes == 1:
        where = "1 node (standalone)"
    else:
        store = "an external store" if node.external_store else "hosted by node 0"
        where = (f"node {node.node_rank} of {node_count(node)} at {node_addr}, rendezvous "
                 f"{node.master_addr or node_addr}:{node.master_port} ({store})")
    stop = f", stop after {node.stop_after_s}s" if node.stop_after_s > 0 else ""
    say(f"run '{node.run_id}': {where}, {nproc} process(es), max restarts {node.max_restarts}{stop}")
    if node.dry_run:
        print(shlex.join([sys.executable, "-m", "distqa.launch.agent", *args]), flush=True)
        return 0
    # A node other than 0 (every node, with --external-store) first waits (up to the join timeout) until the
    # rendezvous store accepts connections: a node started early just waits, and an unreachable one ends with one
    # line naming address:port and what to check, instead of torchrun's RendezvousConnectionError after 60 s.
    waits = node.nnodes > 1 and (node.node_rank > 0 or node.external_store)
    if waits and (message := reachability.wait_for_rendezvous(node.master_addr, node.master_port, node.join_timeout)):
        raise NodeError(f"run '{node.run_id}' node {node.node_rank}: {message}", reachability.UNREACHABLE_EXIT_CODE)
    reports = Path(tempfile.mkdtemp(prefix="distqa-stop.", dir=environ.get("TMPDIR")))
    environ[WORKER_REPORT_DIR_VARIABLE] = str(reports)
    try:
        with stop_timer(node):
            status = run_agent(args)
        return outcome(node, status, reports, run_dir)
    finally:
        with suppress(OSError):
            for report in reports.iterdir():
                report.unlink()
            reports.rmdir()


def main(argv: Sequence[str] | None = None, repo_root: Path | None = None) -> int:
    """``python -m distqa.launch.node [OPTIONS] [--] [TRAINER ARGS...]`` (what ``scripts/worker.sh`` runs): the node's
    exit status; a wrong option or setting is one line and exit 2."""
    environ = os.environ
    repo_root = repo_root or Path(environ.get(CHECKOUT_VARIABLE) or REPO_ROOT)
    try:
        node = read_node(sys.argv[1:] if argv is None else argv, environ, repo_root)
        if node is None:
            print(USAGE, end="")
            return 0
        return start(node, environ, repo_root)
    except NodeError as err:
        say(str(err))
        return err.status


if __name__ == "__main__":
    sys.exit(main())
