"""The in-job entry point: one torchrun agent for this node, joining the run's c10d rendezvous.
Every node of a run executes it (a platform job per node, a container, a Slurm task, a Kubernetes pod); the node
with --node-rank 0 is the master and hosts the rendezvous store on --master-port.

Usage:
  scripts/worker.sh [--nnodes N] [--min-nodes MIN] [--node-rank I] [--master-addr HOST] [--master-port P]
                    [--run-id ID] [--max-restarts R] [--nproc-per-node M] [--join-timeout S] [--external-store]
                    [--dry-run] [--project-args]
                    [--doctor | --entry-module MODULE] [--] [TRAINER ARGS...]

  scripts/worker.sh --nnodes 1 -- --preset bert-base                    # one node, all its GPUs
  scripts/worker.sh --nnodes 2 --node-rank 0 --run-id r1                # the master
  scripts/worker.sh --nnodes 2 --node-rank 1 --master-addr job-1234.platform-jobs --run-id r1

worker.sh finds the interpreter and runs `python -m distqa.launch.node` with its arguments (the same command
line, in one Python process that also runs torchrun's agent). Arguments after -- go to `python -m distqa.train`
(or --entry-module) unchanged; --run-name is set to the run id, so all nodes write one run directory (put it on
shared storage: DISTQA_OUTPUT_DIR) and a restart with the same run id resumes from its newest checkpoint. The
repository is put on PYTHONPATH, so a fork's own packages beside src/ (examples/, a task given as
--task package.module:ClassName) import on every node.

Options:
  --nnodes N          nodes in the run (default 1: `torchrun --standalone`, no master needed)
  --min-nodes MIN     elastic membership (default N: a fixed node count): the run goes on while at least
                      MIN of the N nodes are alive. torchrun's --nnodes MIN:N: after a node is lost the
                      agents meet in a new rendezvous round that completes once MIN nodes have joined and
                      the last call (RDZV_LAST_CALL_TIMEOUT s) has passed, the workers resume from the newest
                      checkpoint at the new world size (same global batch: the accumulation changes); a node
                      that joins later (started again with the same arguments) makes the run grow back.
                      Membership changes need --max-restarts >= 1 for each node lost; each is one log line
                      ("membership: round R: …"). Every world size in the range must split the global batch
                      (checked before the rendezvous: distqa.distributed.elastic.check_node_range)
  --node-rank I       index of this node, 0..N-1; node 0 hosts the rendezvous (torchrun's
                      is_host) and needs no --master-addr
  --master-addr HOST  address of node 0 as the other nodes reach it (platform: its internal
                      hostname); required on nodes 1..N-1
  --master-port P     TCP port of the rendezvous on node 0 (default 29400)
  --external-store    the rendezvous store runs outside the training nodes (python -m distqa.launch.rendezvous_store
                      --port P on a CPU job, the Slurm batch host): every node, node 0 too, is its client at
                      --master-addr:--master-port (required on every node), so losing any node, node 0
                      included, leaves an elastic run (--min-nodes) going. Give it to every node or to none
  --run-id ID         rendezvous id and run directory name, the same on every node (default distqa)
  --max-restarts R    torchrun restarts of every worker after one fails (default 0)
  --nproc-per-node M  training processes here (default: the number of GPUs, or 1 without GPUs)
  --join-timeout S    seconds the rendezvous waits for every node to join (default
                      $RDZV_JOIN_TIMEOUT, else 900); on the platform the launcher passes the
                      schedule timeout + 300, so a node that was queued that long still joins
  --stop-after SPAN   ask the workers to stop after SPAN ([Nd][Nh][Nm][Ns] or seconds; default 0 =
                      never): SIGTERM to torchrun, so they checkpoint the step reached and exit 75.
                      Set it below a job's life span or time limit, so the stop does not depend on
                      the signal (and grace period) the platform sends at the end
  --life-span SPAN    the job's life span or time limit (the same forms, or neuro-flow's seconds such
                      as 3600.5): without --stop-after, stop after SPAN minus a tenth of it, at most
                      15 min before the end (1d → 23h45m, 1h → 54m), so the stop and its checkpoint
                      come before the platform's kill; .neuro/live.yml passes the job's life_span.
                      Exports WORKER_STOP_WINDOW_S (the seconds from the stop to the end), which the
                      trainer compares with its first checkpoint write
  --dry-run           print the torchrun command instead of running it
  --project-args      the trainer flags start with project.toml's [jobs] args (the project's own: its preset, its
                      task), then those after -- (which win): the jobs in deploy/ pass it, so a fork sets its
                      flags in its project.toml, not in the template's job files
  --doctor            run the preflight doctor (python -m distqa.doctor) instead of training, with the
                      same torchrun line and arguments (no restarts): rank 0 prints a table of every rank
                      and what to fix; exit 1 when a check fails
  --entry-module M    the Python module every process runs (python -m M; default distqa.train): a
                      fork's own entry point gets the same torchrun line, rendezvous, restarts,
                      stop signals and --run-name; --doctor is --entry-module distqa.doctor

Exit status: torchrun's (0 when the run finished); the workers' own when each one that failed said why
(2: a configuration or data error, such as ranks that run other code); 75 when the workers stopped on SIGTERM/SIGINT
at a step boundary after a checkpoint of that step (start the node again with the same --run-id to
resume); 3 when node 0's rendezvous at --master-addr:--master-port could not be reached within the
join timeout; 4 when the rendezvous did not fill up within the join timeout (the line names the nodes
that joined and those that did not); 2 for a wrong option. Each failure says why in one line.

Environment:
  PYTHON              interpreter with distqa installed (default: the repository's .venv/bin/python
                      if there is one, else python3, else python)
  NODE_CORES          CPU cores this node's processes share (default: all, `nproc`); each process
                      gets NODE_CORES / processes OpenMP threads unless OMP_NUM_THREADS is set
  NODE_ADDR           the address other nodes reach this node at (default: this host's name
                      resolved, as in containers and Kubernetes pods); torchrun's --local-addr
  RDZV_JOIN_TIMEOUT   default of --join-timeout
  MIN_NODES           default of --min-nodes
  SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE   set by SkyPilot on
                      each node of a task (deploy/skypilot/task.yaml): the defaults of --nnodes, --node-rank,
                      --master-addr (the first address, on nodes 1..N-1) and --nproc-per-node (the GPUs; 0 GPUs:
                      the default); NODE_ADDR from this node's line of SKYPILOT_NODE_IPS. A flag given wins.
                      With --external-store, --master-addr is the store's, given: no engine names that host
  RDZV_LAST_CALL_TIMEOUT, RDZV_KEEP_ALIVE_INTERVAL, RDZV_KEEP_ALIVE_MAX_ATTEMPT   torchrun's rendezvous
                      settings (last_call_timeout: seconds a round waits for more nodes once MIN have
                      joined, default 30; a node is declared dead after interval × attempts seconds
                      without a heartbeat, default 5 × 3); passed only when set
  NPROC_PER_NODE, MAX_RESTARTS   defaults of the flags of the same name
  Kubeflow (deploy/kubernetes/, docs/KUBERNETES.md): what Trainer v2 (TrainJob) and the training operator v1
  (PyTorchJob) set in a pod are the defaults of the flags (a flag given wins, over MIN_NODES, NPROC_PER_NODE and
  MAX_RESTARTS too); they are read, then unset, so torchrun (which takes PET_<OPTION> as its --<option>) gets
  worker.sh's flags only:
                      PET_NNODES (N, or an elastic MIN:MAX) → --nnodes (and --min-nodes);
                      PET_NODE_RANK, else RANK → --node-rank;
                      PET_MASTER_ADDR, else MASTER_ADDR → --master-addr on nodes 1..N-1 (node 0 hosts the
                      rendezvous at its own address: a pod's DNS name may not resolve yet);
                      PET_MASTER_PORT, else MASTER_PORT → --master-port (Trainer 29500, the operator 23456);
                      PET_NPROC_PER_NODE: a number → --nproc-per-node; auto or gpu → the default above;
                      elastic (elasticPolicy): PET_RDZV_ENDPOINT HOST:PORT → --master-addr, --master-port;
                      PET_RDZV_BACKEND must be c10d; PET_RDZV_ID → --run-id; PET_MAX_RESTARTS → --max-restarts;
                      PET_RDZV_CONF's join_timeout → --join-timeout, last_call_timeout, keep_alive_interval,
                      keep_alive_max_attempt → the RDZV_* above; PET_STANDALONE (even empty): one node. It gives
                      no node rank: pass --node-rank (the pod's replica index). WORLD_SIZE is unset too (the
                      operator's counts nodes); any other PET_* variable stops the node (exit 2)
  TORCH_FR_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE   the NCCL flight
                      recorder: 2000 entries, dumped on a timeout to <run dir>/flight-recorder/rank_<R>
  Network between nodes: NCCL picks an interface by itself; pin it with NCCL_SOCKET_IFNAME=eth0
  (GPUs) or GLOO_SOCKET_IFNAME=eth0 (CPU, gloo); NCCL_DEBUG=INFO prints what NCCL chose, and
  NCCL_IB_DISABLE=1 forces TCP where InfiniBand is advertised but not usable. On the platform set
  them in `defaults: env:` of .neuro/project.yml (a local .env is not part of the image).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

USAGE = __doc__ or ""
"""What ``scripts/worker.sh --help`` prints: this module's documentation."""

RENDEZVOUS_SETTINGS = {"last_call_timeout": "RDZV_LAST_CALL_TIMEOUT", "keep_alive_interval": "RDZV_KEEP_ALIVE_INTERVAL",
                       "keep_alive_max_attempt": "RDZV_KEEP_ALIVE_MAX_ATTEMPT"}
"""torchrun's rendezvous settings (``--rdzv-conf`` keys) the node passes on from these variables when they are set."""
STOP_WINDOW_VARIABLE = "WORKER_STOP_WINDOW_S"
"""The seconds from the --stop-after stop to the job's end (distqa.distributed.stop.graceful_stop_window)."""
_WHOLE = re.compile(r"[0-9]+")
_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
"""A dotted Python module name (``--entry-module``, here and in the platform launcher)."""
# The time spans of --stop-after and --life-span, here and in the platform launcher: neuro-flow reads a job's
# life_span as a number of seconds (Python's float, then int) or as d/h/m/s parts in that order
# (apolo_flow.expr.OptTimeDeltaExpr); anything else fails there after some nodes have started. Of float's rarer
# spellings (blanks, '_', 3-digit exponents: 1e400 is inf, which int refuses) none is taken.
_SECONDS = re.compile(r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,2})?")
_SPAN = re.compile(r"([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


class NodeError(Exception):
    """A wrong option or setting, in one line (worker.sh prints it after ``worker.sh: ``), with its exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class NodeOptions:
    """The options as given, from the engines' variables (:mod:`distqa.launch.engines`), then the command line: text
    until :func:`check` reads them, as each source may give anything."""

    nnodes: str = "1"
    min_nodes: str = ""
    node_rank: str = "0"
    master_addr: str = ""
    master_port: str = "29400"
    external_store: bool = False
    run_id: str = "distqa"
    max_restarts: str = "0"
    nproc_per_node: str = ""
    join_timeout: str = "900"
    stop_after: str = "0"
    life_span: str = ""
    dry_run: bool = False
    project_args: bool = False
    entry_module: str = "distqa.train"
    trainer_args: list[str] = field(default_factory=list)
    engine_master_addr: str = ""
    """Node 0's address as an engine named it (Kubeflow's, SkyPilot's): --master-addr of nodes 1..N-1 unless given."""
    help: bool = False

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str]) -> NodeOptions:
        """The defaults the environment sets: MIN_NODES, MAX_RESTARTS, NPROC_PER_NODE, RDZV_JOIN_TIMEOUT."""
        return cls(min_nodes=environ.get("MIN_NODES", ""), max_restarts=environ.get("MAX_RESTARTS") or "0",
                   nproc_per_node=environ.get("NPROC_PER_NODE", ""),
                   join_timeout=environ.get("RDZV_JOIN_TIMEOUT") or "900")


@dataclass(frozen=True)
class Node:
    """This node's part in the run, every option checked."""

    nnodes: int
    min_nodes: int
    node_rank: int
    master_addr: str
    master_port: int
    external_store: bool
    run_id: str
    max_restarts: int
    nproc_per_node: int | None
    """None: one process per GPU (:func:`distqa.launch.node.processes_here`)."""
    join_timeout: int
    stop_after_s: int
    """0: never."""
    dry_run: bool
    entry_module: str
    trainer_args: list[str]


_VALUED = {"--nnodes": "nnodes", "--min-nodes": "min_nodes", "--node-rank": "node_rank",
           "--master-addr": "master_addr", "--master-port": "master_port", "--run-id": "run_id",
           "--max-restarts": "max_restarts", "--nproc-per-node": "nproc_per_node", "--join-timeout": "join_timeout",
           "--stop-after": "stop_after", "--life-span": "life_span", "--entry-module": "entry_module"}
_SWITCHES: dict[str, tuple[str, str | bool]] = {
    "--external-store": ("external_store", True), "--dry-run": ("dry_run", True),
    "--project-args": ("project_args", True), "--doctor": ("entry_module", "distqa.doctor")}


def read_flags(argv: Sequence[str], valued: Mapping[str, str],
               switches: Mapping[str, tuple[str, str | bool]]) -> tuple[dict[str, str | bool], list[str]] | None:
    """The flags before ``--`` as {name: value} (``valued``: flag → name; ``switches``: flag → name, value) and the
    words after ``--``, for the node and the platform launcher alike; None for ``-h``/``--help``, which ends the
    reading. A :class:`ValueError` names a flag without its value, or a word that is no flag."""
    found: dict[str, str | bool] = {}
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag in ("-h", "--help"):
            return None
        if flag == "--":
            break
        if flag.startswith("--") and "=" in flag and flag.partition("=")[0] in valued:  # --flag=value, as argparse
            flag, _, value = flag.partition("=")
            args.insert(0, value)
        if flag in switches:
            name, value = switches[flag]
            found[name] = value
        elif flag not in valued:
            raise ValueError(f"unknown option '{flag}'; trainer flags go after -- (see --help)")
        elif not args:
            raise ValueError(f"{flag} needs a value (see --help)")
        else:
            found[valued[flag]] = args.pop(0)
    return found, args


def parse_command_line(argv: Sequence[str], options: NodeOptions) -> NodeOptions:
    """``options`` with the command line's flags over them (a flag given wins over every variable); what follows
    ``--`` is the trainer's. ``-h``/``--help`` sets ``options.help`` and ends the reading."""
    try:
        read = read_flags(argv, _VALUED, _SWITCHES)
    except ValueError as err:
        raise NodeError(str(err)) from err
    flags, trainer_args = read or ({"help": True}, [])
    for name, value in flags.items():
        setattr(options, name, value)
    options.trainer_args += trainer_args
    return options


def seconds_of(span: str) -> int | None:
    """A time span in whole seconds: ``1d12h``, ``90m``, ``3600``, and neuro-flow's float seconds (``3600.5``,
    ``1e4``: rounded half to even, as printf rounds); None when ``span`` is none of these."""
    if _SECONDS.fullmatch(span):
        return int(format(float(span), ".0f"))
    if not span or not _SPAN.fullmatch(span):
        return None
    return sum(int(part[:-1]) * _UNITS[part[-1]] for part in re.findall(r"[0-9]+[dhms]", span))


def stop_times(stop_after: str, life_span: str) -> tuple[int, int | None]:
    """The seconds after which the workers are asked to stop (0: never), and the seconds from that stop to the
    job's end (None when not known). Without --stop-after, a job with a life span stops a tenth of it before the
    end, at most 15 min (1d → 23h45m, 1h → 54m): the stop needs stop_check_every steps and one checkpoint write,
    and the margin also covers the job's start-up before the node runs (the platform counts from the job's start)."""
    stop_s = seconds_of(stop_after)
    if stop_s is None:
        raise NodeError(f"--stop-after must be [Nd][Nh][Nm][Ns] (1d, 23h30m, 90m) or seconds, got '{stop_after}'")
    if not life_span:
        return stop_s, None
    life_s = seconds_of(life_span)
    if life_s is None:
        raise NodeError(f"--life-span must be [Nd][Nh][Nm][Ns] (1d, 6h, 90m) or seconds, got '{life_span}'")
    if stop_s == 0 and life_s > 0:
        stop_s = max(life_s - min(life_s // 10, 900), 1)
    return stop_s, (life_s - stop_s if 0 < stop_s < life_s else None)


def check(options: NodeOptions, environ: MutableMapping[str, str]) -> Node:
    """The options, read and checked in worker.sh's order: the first wrong one is a :class:`NodeError` naming it.
    Exports WORKER_STOP_WINDOW_S to ``environ`` (see --life-span)."""
    stop_after_s, window_s = stop_times(options.stop_after, options.life_span)
    if window_s is not None:
        environ[STOP_WINDOW_VARIABLE] = str(window_s)
    min_nodes = options.min_nodes or options.nnodes
    if not options.node_rank and options.engine_master_addr:
        raise NodeError("--node-rank is required with an elastic PyTorchJob (PET_RDZV_ENDPOINT, no node rank): pass "
                        "the pod's replica index, as deploy/kubernetes/pytorchjob-elastic.yaml does")
    master_addr = options.master_addr
    # The engine's name for node 0 serves the other nodes (a node rank above 0: a whole number, not all zeros); node 0
    # itself hosts the rendezvous at its own address, as on every launcher: a pod's DNS name may not resolve before the
    # pod is ready. An external store is no engine's node: its address is --master-addr's alone.
    if not (master_addr or options.external_store) and options.node_rank.lstrip("0").isdecimal():
        master_addr = options.engine_master_addr
    numbers = {"nnodes": options.nnodes, "min_nodes": min_nodes, "node_rank": options.node_rank,
               "master_port": options.master_port, "max_restarts": options.max_restarts,
               "join_timeout": options.join_timeout}
    for name, text in numbers.items():
        if not _WHOLE.fullmatch(text):
            raise NodeError(f"--{name.replace('_', '-')} must be a whole number, got '{text}'")
    nnodes, low, node_rank, port = (int(numbers[name]) for name in ("nnodes", "min_nodes", "node_rank", "master_port"))
    setting = next((name for name in RENDEZVOUS_SETTINGS.values()
                    if not re.fullmatch(r"[1-9][0-9]*", environ.get(name) or "1")), "")
    nproc = options.nproc_per_node
    for wrong, message in (
        (nnodes < 1, "--nnodes must be at least 1"),
        (not 1 <= low <= nnodes, f"--min-nodes must be in 1..{nnodes} (--nnodes), got {low}"),
        (setting, f"{setting} must be a positive whole number of seconds, got '{environ.get(setting)}'"),
        (node_rank >= nnodes, f"--node-rank {node_rank} is outside 0..{nnodes - 1} for --nnodes {nnodes}"),
        (not 1024 <= port <= 65535, f"--master-port must be in 1024..65535, got {port}"),
        (not _RUN_ID.fullmatch(options.run_id),
         f"--run-id may hold letters, digits, '.', '_' and '-' only, got '{options.run_id}'"),
        (not MODULE_NAME.fullmatch(options.entry_module),
         f"--entry-module must be a dotted Python module name such as mytask.train, got '{options.entry_module}'"),
        (options.external_store and not master_addr,
         "--external-store needs --master-addr: the address of the host running python -m "
         "distqa.launch.rendezvous_store"),
        (node_rank > 0 and not master_addr,
         f"--master-addr is required on node {node_rank}: the address of node 0 (its internal hostname on the "
         "platform)"),
        (nproc and not re.fullmatch(r"[1-9][0-9]*", nproc),
         f"--nproc-per-node must be a positive whole number, got '{nproc}'"),
    ):
        if wrong:
            raise NodeError(message)
    # A failed check is the doctor's finding, not a fault: a restart would only run it again and print its table.
    max_restarts = 0 if options.entry_module == "distqa.doctor" else int(options.max_restarts)
    return Node(nnodes=nnodes, min_nodes=low, node_rank=node_rank, master_addr=master_addr, master_port=port,
                external_store=options.external_store, run_id=options.run_id, max_restarts=max_restarts,
                nproc_per_node=int(nproc) if nproc else None, join_timeout=int(options.join_timeout),
                stop_after_s=stop_after_s, dry_run=options.dry_run, entry_module=options.entry_module,
                trainer_args=list(options.trainer_args))


def project_words(repo_root: Path, environ: MutableMapping[str, str]) -> list[str]:
    """project.toml's [jobs] args (--project-args), split as a shell would, each ${NAME} the environment's NAME;
    a wrong project.toml is a :class:`NodeError` in project.py's words."""
    # Standard library only: the Makefile and the Dockerfile run it as a script, before any environment exists.
    from distqa.upkeep.project import ProjectError, split_setting

    try:
        return split_setting(repo_root / "project.toml", "jobs.args", dict(environ))
    except ProjectError as err:
        raise NodeError(str(err)) from err
