"""What an engine tells a node about its run, as the defaults of worker.sh's flags (a flag given wins; which variable
gives which flag: worker.sh --help, "Environment").

Kubeflow (docs/KUBERNETES.md, "What each engine gives a pod", cites the controllers' sources): Trainer v2 (TrainJob)
and the training operator v1 (PyTorchJob, elastic or not) set PET_* variables, which torchrun would read as its own
options behind the node's flags, so :func:`kubeflow_environment` reads them and unsets them. SkyPilot 0.14
(deploy/skypilot/task.yaml; docs/SKYPILOT.md; sky/skylet/constants.py, sky/backends/task_codegen.py) runs a task's
``run:`` on each node with SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (one address a line, in rank order),
SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE: :func:`skypilot_environment` reads them.

Both take the node's :class:`~distqa.launch.node_options.NodeOptions` (its defaults so far) and the environment, which
they change as the node's processes must see it; each wrong value is a one-line
:class:`~distqa.launch.node_options.NodeError`.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping

from distqa.launch.node_options import RENDEZVOUS_SETTINGS, NodeError, NodeOptions

KUBEFLOW_VARIABLES = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE",
                      "PET_MAX_RESTARTS", "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_RDZV_ID", "PET_RDZV_CONF",
                      "PET_STANDALONE")
"""The PET_* variables a Kubeflow controller sets that the node reads; any other stops it."""


def kubeflow_environment(options: NodeOptions, environ: MutableMapping[str, str]) -> NodeOptions:
    """``options`` with Kubeflow's variables as their defaults; the variables, and MASTER_ADDR, MASTER_PORT,
    WORLD_SIZE and RANK (the operator's count nodes, not processes: torchrun sets the workers' own), leave
    ``environ``; rdzvConf's rendezvous settings enter it as RDZV_*. Nothing changes without a PET_* variable."""
    names = [name for name in environ if name.startswith("PET_")]
    if not names:
        return options
    for name in names:
        if name not in KUBEFLOW_VARIABLES:
            raise NodeError(f"{name} is a torchrun option that worker.sh does not read: give it as a worker.sh flag "
                            "(see --help) or remove it from the job's environment")
    get = environ.get
    if nnodes := get("PET_NNODES", ""):
        if elastic := re.fullmatch(r"([0-9]+):([0-9]+)", nnodes):  # an elasticPolicy's minReplicas:maxReplicas
            options.min_nodes, options.nnodes = elastic.groups()
        elif re.fullmatch(r"[0-9]+", nnodes):
            options.nnodes = nnodes
        else:
            raise NodeError(f"PET_NNODES must be N or MIN:MAX (nodes), got '{nnodes}'")
    options.node_rank = get("PET_NODE_RANK") or get("RANK") or options.node_rank
    # An elastic PyTorchJob gives no node rank: the job passes the pod's replica index as --node-rank.
    if get("PET_RDZV_ENDPOINT") and not (get("PET_NODE_RANK") or get("RANK")):
        options.node_rank = ""
    options.engine_master_addr = get("PET_MASTER_ADDR") or get("MASTER_ADDR") or ""
    options.master_port = get("PET_MASTER_PORT") or get("MASTER_PORT") or options.master_port
    if endpoint := get("PET_RDZV_ENDPOINT", ""):  # elastic: the Worker pod of index 0 hosts the rendezvous
        if not (found := re.fullmatch(r"(.+):([0-9]+)", endpoint)):
            raise NodeError(f"PET_RDZV_ENDPOINT must be HOST:PORT, got '{endpoint}'")
        host, port = found.groups()
        if options.engine_master_addr and options.engine_master_addr != host:
            raise NodeError(f"PET_RDZV_ENDPOINT ({host}) and PET_MASTER_ADDR ({options.engine_master_addr}) name other "
                            "hosts: an elastic PyTorchJob has Worker replicas only "
                            "(deploy/kubernetes/pytorchjob-elastic.yaml)")
        options.engine_master_addr, options.master_port = host, port
    if (backend := get("PET_RDZV_BACKEND") or "c10d") != "c10d":
        raise NodeError(f"PET_RDZV_BACKEND={backend}: worker.sh runs torchrun's c10d rendezvous; set rdzvBackend: c10d")
    options.run_id = get("PET_RDZV_ID") or options.run_id
    options.max_restarts = get("PET_MAX_RESTARTS") or options.max_restarts
    for item in filter(None, get("PET_RDZV_CONF", "").split(",")):  # the rendezvous settings the node passes on
        key, _, value = item.partition("=")
        if key == "join_timeout":
            options.join_timeout = value
        elif key in RENDEZVOUS_SETTINGS:  # as the variables of the same settings
            environ[RENDEZVOUS_SETTINGS[key]] = value
        else:
            raise NodeError(f"PET_RDZV_CONF: worker.sh sets '{key}' itself or does not know it; rdzvConf may hold "
                            "join_timeout, last_call_timeout, keep_alive_interval and keep_alive_max_attempt")
    if "PET_STANDALONE" in environ and options.nnodes != "1":  # set, even empty: an elasticPolicy's standalone
        raise NodeError(f"PET_STANDALONE (elasticPolicy standalone) runs one node, but PET_NNODES is "
                        f"{get('PET_NNODES', '')}")
    if (nproc := get("PET_NPROC_PER_NODE") or "auto") not in ("auto", "gpu"):  # auto: a process per GPU, or 1
        if not re.fullmatch(r"[1-9][0-9]*", nproc):
            raise NodeError(f"PET_NPROC_PER_NODE must be auto or a number of processes, got '{nproc}' (nprocPerNode "
                            "/ numProcPerNode of the job)")
        options.nproc_per_node = nproc
    for name in ("node_rank", "master_port", "max_restarts", "join_timeout"):
        if not re.fullmatch(r"[0-9]*", value := getattr(options, name)):
            raise NodeError(f"the job's environment gives {name.replace('_', ' ')} '{value}' (PET_*), not a whole "
                            "number")
    for name in (*names, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        environ.pop(name, None)
    return options


def skypilot_environment(options: NodeOptions, environ: MutableMapping[str, str]) -> NodeOptions:
    """``options`` with SkyPilot's variables as their defaults: the node count and rank, node 0's address as the
    rendezvous of the other nodes, one process per GPU SkyPilot gave the node (0 GPUs: the node's own default);
    this node's own address enters ``environ`` as NODE_ADDR unless set (a VM's hostname need not resolve to the
    address the others reach). Nothing changes without SKYPILOT_NODE_RANK."""
    if not (rank := environ.get("SKYPILOT_NODE_RANK", "")):
        return options
    ips = [line for line in (re.sub(r"\s", "", line) for line in environ.get("SKYPILOT_NODE_IPS", "").splitlines())
           if line]
    if not ips:
        raise NodeError("SKYPILOT_NODE_RANK is set but SKYPILOT_NODE_IPS holds no address (SkyPilot sets both, one "
                        "address a line): unset SKYPILOT_NODE_RANK to give --nnodes, --node-rank and --master-addr "
                        "yourself")
    count = environ.get("SKYPILOT_NUM_NODES") or str(len(ips))
    gpus = environ.get("SKYPILOT_NUM_GPUS_PER_NODE") or "0"
    if not re.fullmatch(r"[0-9]+", rank):
        raise NodeError(f"SKYPILOT_NODE_RANK must be a whole number, got '{rank}'")
    if not re.fullmatch(r"[1-9][0-9]*", count):
        raise NodeError(f"SKYPILOT_NUM_NODES must be a positive whole number, got '{count}'")
    if len(ips) != int(count):
        raise NodeError(f"SKYPILOT_NODE_IPS holds {len(ips)} address(es) for SKYPILOT_NUM_NODES={count}; SkyPilot sets "
                        "both (one address a line): unset them to give --nnodes, --node-rank and --master-addr "
                        "yourself")
    if int(rank) >= int(count):
        raise NodeError(f"SKYPILOT_NODE_RANK {rank} is outside 0..{int(count) - 1} (SKYPILOT_NUM_NODES={count})")
    if not re.fullmatch(r"[0-9]+", gpus):
        raise NodeError(f"SKYPILOT_NUM_GPUS_PER_NODE must be a whole number, got '{gpus}'")
    options.nnodes, options.node_rank, options.engine_master_addr = count, rank, ips[0]
    if not options.nproc_per_node and int(gpus) > 0:
        options.nproc_per_node = gpus
    environ["NODE_ADDR"] = environ.get("NODE_ADDR") or ips[int(rank)]  # this machine's, whatever --node-rank says
    return options
