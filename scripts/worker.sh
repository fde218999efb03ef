#!/usr/bin/env bash
# The in-job entry point: one torchrun agent for this node, joining the run's c10d rendezvous.
# Every node of a run executes it (a platform job per node, a container, a Slurm task, a Kubernetes pod); the node
# with --node-rank 0 is the master and hosts the rendezvous store on --master-port.
#
# Usage:
#   scripts/worker.sh [--nnodes N] [--min-nodes MIN] [--node-rank I] [--master-addr HOST] [--master-port P]
#                     [--run-id ID] [--max-restarts R] [--nproc-per-node M] [--join-timeout S] [--external-store]
#                     [--dry-run] [--project-args]
#                     [--doctor | --entry-module MODULE] [--] [TRAINER ARGS...]
#
#   scripts/worker.sh --nnodes 1 -- --preset bert-base                    # one node, all its GPUs
#   scripts/worker.sh --nnodes 2 --node-rank 0 --run-id r1                # the master
#   scripts/worker.sh --nnodes 2 --node-rank 1 --master-addr job-1234.platform-jobs --run-id r1
#
# Arguments after -- go to `python -m distqa.train` (or --entry-module) unchanged; --run-name is set to
# the run id, so all nodes write one run directory (put it on shared storage: DISTQA_OUTPUT_DIR) and a
# restart with the same run id resumes from its newest checkpoint. The repository is put on PYTHONPATH,
# so a fork's own packages beside src/ (examples/, a task given as --task package.module:ClassName)
# import on every node.
#
# Options:
#   --nnodes N          nodes in the run (default 1: `torchrun --standalone`, no master needed)
#   --min-nodes MIN     elastic membership (default N: a fixed node count): the run goes on while at least
#                       MIN of the N nodes are alive. torchrun's --nnodes MIN:N: after a node is lost the
#                       agents meet in a new rendezvous round that completes once MIN nodes have joined and
#                       the last call (RDZV_LAST_CALL_TIMEOUT s) has passed, the workers resume from the newest
#                       checkpoint at the new world size (same global batch: the accumulation changes); a node
#                       that joins later (started again with the same arguments) makes the run grow back.
#                       Membership changes need --max-restarts >= 1 for each node lost; each is one log line
#                       ("membership: round R: …"). Every world size in the range must split the global batch
#                       (checked here before the rendezvous: python -m distqa.launch.elastic)
#   --node-rank I       index of this node, 0..N-1; node 0 hosts the rendezvous (torchrun's
#                       is_host) and needs no --master-addr
#   --master-addr HOST  address of node 0 as the other nodes reach it (platform: its internal
#                       hostname); required on nodes 1..N-1
#   --master-port P     TCP port of the rendezvous on node 0 (default 29400)
#   --external-store    the rendezvous store runs outside the training nodes (python -m distqa.launch.rendezvous_store
#                       --port P on a CPU job, the Slurm batch host): every node, node 0 too, is its client at
#                       --master-addr:--master-port (required on every node), so losing any node, node 0
#                       included, leaves an elastic run (--min-nodes) going. Give it to every node or to none
#   --run-id ID         rendezvous id and run directory name, the same on every node (default distqa)
#   --max-restarts R    torchrun restarts of every worker after one fails (default 0)
#   --nproc-per-node M  training processes here (default: the number of GPUs, or 1 without GPUs)
#   --join-timeout S    seconds the rendezvous waits for every node to join (default
#                       $RDZV_JOIN_TIMEOUT, else 900); on the platform the launcher passes the
#                       schedule timeout + 300, so a node that was queued that long still joins
#   --stop-after SPAN   ask the workers to stop after SPAN ([Nd][Nh][Nm][Ns] or seconds; default 0 =
#                       never): SIGTERM to torchrun, so they checkpoint the step reached and exit 75.
#                       Set it below a job's life span or time limit, so the stop does not depend on
#                       the signal (and grace period) the platform sends at the end
#   --life-span SPAN    the job's life span or time limit (the same forms, or neuro-flow's seconds such
#                       as 3600.5): without --stop-after, stop after SPAN minus a tenth of it, at most
#                       15 min before the end (1d → 23h45m, 1h → 54m), so the stop and its checkpoint
#                       come before the platform's kill; .neuro/live.yml passes the job's life_span.
#                       Exports WORKER_STOP_WINDOW_S (the seconds from the stop to the end), which the
#                       trainer compares with its first checkpoint write
#   --dry-run           print the torchrun command instead of running it
#   --project-args      the trainer flags start with project.toml's [jobs] args (the project's own: its preset, its
#                       task), then those after -- (which win): the jobs in deploy/ pass it, so a fork sets its
#                       flags in its project.toml, not in the template's job files
#   --doctor            run the preflight doctor (python -m distqa.doctor) instead of training, with the
#                       same torchrun line and arguments (no restarts): rank 0 prints a table of every rank
#                       and what to fix; exit 1 when a check fails
#   --entry-module M    the Python module every process runs (python -m M; default distqa.train): a
#                       fork's own entry point gets the same torchrun line, rendezvous, restarts,
#                       stop signals and --run-name; --doctor is --entry-module distqa.doctor
#
# Exit status: torchrun's (0 when the run finished); the workers' own when each one that failed said why
# (2: a configuration or data error, such as ranks that run other code); 75 when the workers stopped on SIGTERM/SIGINT at a
# step boundary after a checkpoint of that step (start the node again with the same --run-id to
# resume); 3 when node 0's rendezvous at --master-addr:--master-port could not be reached within the
# join timeout; 4 when the rendezvous did not fill up within the join timeout (the line names the nodes
# that joined and those that did not); 2 for a wrong option. Each failure says why in one line.
#
# Environment:
#   PYTHON              interpreter with distqa installed (default: the repository's .venv/bin/python
#                       if there is one, else python3, else python)
#   NODE_CORES          CPU cores this node's processes share (default: all, `nproc`); each process
#                       gets NODE_CORES / processes OpenMP threads unless OMP_NUM_THREADS is set
#   NODE_ADDR           the address other nodes reach this node at (default: this host's name
#                       resolved, as in containers and Kubernetes pods); torchrun's --local-addr
#   RDZV_JOIN_TIMEOUT   default of --join-timeout
#   MIN_NODES           default of --min-nodes
#   SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE   set by SkyPilot on
#                       each node of a task (deploy/skypilot/task.yaml): the defaults of --nnodes, --node-rank,
#                       --master-addr (the first address, on nodes 1..N-1) and --nproc-per-node (the GPUs; 0 GPUs:
#                       the default); NODE_ADDR from this node's line of SKYPILOT_NODE_IPS. A flag given wins.
#                       With --external-store, --master-addr is the store's, given: no engine names that host
#   RDZV_LAST_CALL_TIMEOUT, RDZV_KEEP_ALIVE_INTERVAL, RDZV_KEEP_ALIVE_MAX_ATTEMPT   torchrun's rendezvous
#                       settings (last_call_timeout: seconds a round waits for more nodes once MIN have
#                       joined, default 30; a node is declared dead after interval × attempts seconds
#                       without a heartbeat, default 5 × 3); passed only when set
#   NPROC_PER_NODE, MAX_RESTARTS   defaults of the flags of the same name
#   Kubeflow (deploy/kubernetes/, docs/KUBERNETES.md): what Trainer v2 (TrainJob) and the training operator v1
#   (PyTorchJob) set in a pod are the defaults of the flags (a flag given wins, over MIN_NODES, NPROC_PER_NODE and
#   MAX_RESTARTS too); they are read, then unset, so torchrun (which takes PET_<OPTION> as its --<option>) gets
#   worker.sh's flags only:
#                       PET_NNODES (N, or an elastic MIN:MAX) → --nnodes (and --min-nodes);
#                       PET_NODE_RANK, else RANK → --node-rank;
#                       PET_MASTER_ADDR, else MASTER_ADDR → --master-addr on nodes 1..N-1 (node 0 hosts the
#                       rendezvous at its own address: a pod's DNS name may not resolve yet);
#                       PET_MASTER_PORT, else MASTER_PORT → --master-port (Trainer 29500, the operator 23456);
#                       PET_NPROC_PER_NODE: a number → --nproc-per-node; auto or gpu → the default above;
#                       elastic (elasticPolicy): PET_RDZV_ENDPOINT HOST:PORT → --master-addr, --master-port;
#                       PET_RDZV_BACKEND must be c10d; PET_RDZV_ID → --run-id; PET_MAX_RESTARTS → --max-restarts;
#                       PET_RDZV_CONF's join_timeout → --join-timeout, last_call_timeout, keep_alive_interval,
#                       keep_alive_max_attempt → the RDZV_* above; PET_STANDALONE (even empty): one node. It gives
#                       no node rank: pass --node-rank (the pod's replica index). WORLD_SIZE is unset too (the
#                       operator's counts nodes); any other PET_* variable stops the script (exit 2)
#   TORCH_FR_BUFFER_SIZE, TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE   the NCCL flight
#                       recorder: 2000 entries, dumped on a timeout to <run dir>/flight-recorder/rank_<R>
#   Network between nodes: NCCL picks an interface by itself; pin it with NCCL_SOCKET_IFNAME=eth0
#   (GPUs) or GLOO_SOCKET_IFNAME=eth0 (CPU, gloo); NCCL_DEBUG=INFO prints what NCCL chose, and
#   NCCL_IB_DISABLE=1 forces TCP where InfiniBand is advertised but not usable. On the platform set
#   them in `defaults: env:` of .neuro/project.yml (a local .env is not part of the image).
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$script_dir/common.sh"
find_python "$repo_root"
nnodes=1
min_nodes="${MIN_NODES:-}"
node_rank=0
master_addr=""
master_port=29400
external_store=0
run_id=distqa
max_restarts="${MAX_RESTARTS:-0}"
nproc_per_node="${NPROC_PER_NODE:-}"
join_timeout="${RDZV_JOIN_TIMEOUT:-900}"
stop_after=0
life_span=""
dry_run=0
project_args=0
entry_point=distqa.train

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "worker.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 ]] || die "$1 needs a value (see --help)"; }

# --- Kubeflow: what its controllers give a node, as the defaults of the flags ------------------------------------
# Trainer v2.3 (TrainJob, pkg/runtime/framework/plugins/torch/torch.go) sets PET_NNODES, PET_NPROC_PER_NODE,
# PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT and leaves torchrun to the job's command; the training operator
# v1.9 (PyTorchJob, pkg/controller.v1/pytorch/envvar.go, master.go, elastic.go) sets the same plus MASTER_ADDR,
# MASTER_PORT, WORLD_SIZE and RANK, and with an elasticPolicy PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_RDZV_ID,
# PET_RDZV_CONF, PET_MAX_RESTARTS and PET_STANDALONE. torchrun reads every PET_<OPTION> as its --<option> (torch's
# distributed/argparse_util.py), behind the flags given here: PET_STANDALONE="" makes torch 2.13's torchrun fail
# with a ValueError, PET_NODE_RANK warns on every node but 0. So they are read here, as the defaults of worker.sh's
# flags (a flag given on the command line wins), and unset: torchrun gets worker.sh's flags only.
engine_master_addr=""
kubeflow_environment() {
    local name names=() host port conf item key value
    for name in $(compgen -e); do [[ "$name" != PET_* ]] || names+=("$name"); done
    (( ${#names[@]} )) || return 0
    for name in "${names[@]}"; do
        case "$name" in
            PET_NNODES|PET_NODE_RANK|PET_MASTER_ADDR|PET_MASTER_PORT|PET_NPROC_PER_NODE|PET_MAX_RESTARTS) ;;
            PET_RDZV_ENDPOINT|PET_RDZV_BACKEND|PET_RDZV_ID|PET_RDZV_CONF|PET_STANDALONE) ;;
            *) die "$name is a torchrun option that worker.sh does not read: give it as a worker.sh flag (see --help)" \
                   "or remove it from the job's environment" ;;
        esac
    done
    if [[ -n "${PET_NNODES:-}" ]]; then
        if [[ "$PET_NNODES" =~ ^([0-9]+):([0-9]+)$ ]]; then  # an elasticPolicy's minReplicas:maxReplicas
            min_nodes="${BASH_REMATCH[1]}"; nnodes="${BASH_REMATCH[2]}"
        elif [[ "$PET_NNODES" =~ ^[0-9]+$ ]]; then
            nnodes="$PET_NNODES"
        else
            die "PET_NNODES must be N or MIN:MAX (nodes), got '$PET_NNODES'"
        fi
    fi
    node_rank="${PET_NODE_RANK:-${RANK:-$node_rank}}"
    # An elastic PyTorchJob gives no node rank: the job passes the pod's replica index as --node-rank.
    [[ -z "${PET_RDZV_ENDPOINT:-}" || -n "${PET_NODE_RANK:-}${RANK:-}" ]] || node_rank=""
    engine_master_addr="${PET_MASTER_ADDR:-${MASTER_ADDR:-}}"
    master_port="${PET_MASTER_PORT:-${MASTER_PORT:-$master_port}}"
    if [[ -n "${PET_RDZV_ENDPOINT:-}" ]]; then  # elastic: the Worker pod of index 0 hosts the rendezvous
        [[ "$PET_RDZV_ENDPOINT" =~ ^(.+):([0-9]+)$ ]] || die "PET_RDZV_ENDPOINT must be HOST:PORT, got '$PET_RDZV_ENDPOINT'"
        host="${BASH_REMATCH[1]}"; port="${BASH_REMATCH[2]}"
        if [[ -n "$engine_master_addr" && "$engine_master_addr" != "$host" ]]; then
            die "PET_RDZV_ENDPOINT ($host) and PET_MASTER_ADDR ($engine_master_addr) name other hosts: an elastic" \
                "PyTorchJob has Worker replicas only (deploy/kubernetes/pytorchjob-elastic.yaml)"
        fi
        engine_master_addr="$host"; master_port="$port"
    fi
    [[ "${PET_RDZV_BACKEND:-c10d}" == c10d ]] \
        || die "PET_RDZV_BACKEND=$PET_RDZV_BACKEND: worker.sh runs torchrun's c10d rendezvous; set rdzvBackend: c10d"
    run_id="${PET_RDZV_ID:-$run_id}"
    max_restarts="${PET_MAX_RESTARTS:-$max_restarts}"
    IFS=, read -r -a conf <<< "${PET_RDZV_CONF:-}"
    for item in "${conf[@]}"; do  # an elasticPolicy's rdzvConf: the rendezvous settings worker.sh passes on
        key="${item%%=*}"; value="${item#*=}"
        case "$key" in
            join_timeout) join_timeout="$value" ;;
            last_call_timeout) export RDZV_LAST_CALL_TIMEOUT="$value" ;;
            keep_alive_interval) export RDZV_KEEP_ALIVE_INTERVAL="$value" ;;
            keep_alive_max_attempt) export RDZV_KEEP_ALIVE_MAX_ATTEMPT="$value" ;;
            *) die "PET_RDZV_CONF: worker.sh sets '$key' itself or does not know it; rdzvConf may hold join_timeout," \
                   "last_call_timeout, keep_alive_interval and keep_alive_max_attempt" ;;
        esac
    done
    if [[ -v PET_STANDALONE ]]; then  # set, even empty: an elasticPolicy's standalone, one node
        [[ "$nnodes" == 1 ]] || die "PET_STANDALONE (elasticPolicy standalone) runs one node, but PET_NNODES is $PET_NNODES"
    fi
    case "${PET_NPROC_PER_NODE:-auto}" in
        auto|gpu) ;;  # worker.sh's own default: a process per GPU, or 1 without GPUs
        *) [[ "$PET_NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "PET_NPROC_PER_NODE must be auto or a number of" \
               "processes, got '$PET_NPROC_PER_NODE' (nprocPerNode / numProcPerNode of the job)"
           nproc_per_node="$PET_NPROC_PER_NODE" ;;
    esac
    for name in node_rank master_port max_restarts join_timeout; do
        [[ "${!name}" =~ ^[0-9]*$ ]] || die "the job's environment gives ${name//_/ } '${!name}' (PET_*), not a whole number"
    done
    # The operator's WORLD_SIZE and RANK count nodes, not processes: torchrun sets the workers' own.
    unset "${names[@]}" MASTER_ADDR MASTER_PORT WORLD_SIZE RANK
}
kubeflow_environment

# SkyPilot (deploy/skypilot/task.yaml; docs/SKYPILOT.md): a task's `run:` runs on each of its num_nodes nodes
# with SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (the nodes' addresses, one a line, in rank order),
# SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE (0 without GPUs) set (SkyPilot 0.14: sky/skylet/constants.py,
# sky/backends/task_codegen.py RayCodeGen._add_ray_task). As Kubeflow's above, they are the defaults of the flags:
# the node count and rank, node 0's address as the rendezvous of the other nodes, this node's own address as
# NODE_ADDR (a VM's hostname need not resolve to the address the others reach), and one process per GPU SkyPilot
# gave the node (0 GPUs: the default below, one per visible GPU or 1).
skypilot_environment() {
    [[ -n "${SKYPILOT_NODE_RANK:-}" ]] || return 0
    local rank="$SKYPILOT_NODE_RANK" count="${SKYPILOT_NUM_NODES:-}" gpus="${SKYPILOT_NUM_GPUS_PER_NODE:-0}" line
    local -a ips=()
    while IFS= read -r line; do
        line="${line//[[:space:]]/}"
        [[ -z "$line" ]] || ips+=("$line")
    done <<< "${SKYPILOT_NODE_IPS:-}"
    (( ${#ips[@]} )) || die "SKYPILOT_NODE_RANK is set but SKYPILOT_NODE_IPS holds no address (SkyPilot sets both," \
        "one address a line): unset SKYPILOT_NODE_RANK to give --nnodes, --node-rank and --master-addr yourself"
    count="${count:-${#ips[@]}}"
    [[ "$rank" =~ ^[0-9]+$ ]] || die "SKYPILOT_NODE_RANK must be a whole number, got '$rank'"
    [[ "$count" =~ ^[1-9][0-9]*$ ]] || die "SKYPILOT_NUM_NODES must be a positive whole number, got '$count'"
    (( ${#ips[@]} == count )) || die "SKYPILOT_NODE_IPS holds ${#ips[@]} address(es) for SKYPILOT_NUM_NODES=$count;" \
        "SkyPilot sets both (one address a line): unset them to give --nnodes, --node-rank and --master-addr yourself"
    (( rank < count )) || die "SKYPILOT_NODE_RANK $rank is outside 0..$(( count - 1 )) (SKYPILOT_NUM_NODES=$count)"
    [[ "$gpus" =~ ^[0-9]+$ ]] || die "SKYPILOT_NUM_GPUS_PER_NODE must be a whole number, got '$gpus'"
    nnodes="$count"
    node_rank="$rank"
    engine_master_addr="${ips[0]}"
    if [[ -z "$nproc_per_node" ]] && (( gpus > 0 )); then nproc_per_node="$gpus"; fi
    export NODE_ADDR="${NODE_ADDR:-${ips[rank]}}"  # this machine's, whatever --node-rank says
}
skypilot_environment

trainer_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nnodes) need_value "$@"; nnodes="$2"; shift 2 ;;
        --min-nodes) need_value "$@"; min_nodes="$2"; shift 2 ;;
        --node-rank) need_value "$@"; node_rank="$2"; shift 2 ;;
        --master-addr) need_value "$@"; master_addr="$2"; shift 2 ;;
        --master-port) need_value "$@"; master_port="$2"; shift 2 ;;
        --run-id) need_value "$@"; run_id="$2"; shift 2 ;;
        --max-restarts) need_value "$@"; max_restarts="$2"; shift 2 ;;
        --nproc-per-node) need_value "$@"; nproc_per_node="$2"; shift 2 ;;
        --join-timeout) need_value "$@"; join_timeout="$2"; shift 2 ;;
        --stop-after) need_value "$@"; stop_after="$2"; shift 2 ;;
        --life-span) need_value "$@"; life_span="$2"; shift 2 ;;
        --external-store) external_store=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        --project-args) project_args=1; shift ;;
        --doctor) entry_point=distqa.doctor; shift ;;
        --entry-module) need_value "$@"; entry_point="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        --) shift; trainer_args+=("$@"); break ;;
        *) die "unknown option '$1'; trainer flags go after -- (see --help)" ;;
    esac
done
if (( project_args )); then
    project_words "$repo_root" jobs.args || exit 2
    trainer_args=("${PROJECT_WORDS[@]}" "${trainer_args[@]}")
fi


# seconds_of SPAN: 1d12h, 90m, 3600 (and 3600.5, 1e4: neuro-flow's float seconds) → whole seconds; fails otherwise
seconds_of() {
    local span="$1" total=0 unit
    if [[ "$span" =~ ^\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,2})?$ ]]; then
        printf '%.0f\n' "$span"
        return
    fi
    [[ -n "$span" && "$span" =~ ^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$ ]] || return 1
    while [[ "$span" =~ ^([0-9]+)([dhms])(.*)$ ]]; do
        case "${BASH_REMATCH[2]}" in d) unit=86400 ;; h) unit=3600 ;; m) unit=60 ;; *) unit=1 ;; esac
        total=$(( total + 10#${BASH_REMATCH[1]} * unit ))
        span="${BASH_REMATCH[3]}"
    done
    echo "$total"
}
stop_after_s="$(seconds_of "$stop_after")" \
    || die "--stop-after must be [Nd][Nh][Nm][Ns] (1d, 23h30m, 90m) or seconds, got '$stop_after'"
stop_after="$stop_after_s"
if [[ -n "$life_span" ]]; then
    life_s="$(seconds_of "$life_span")" \
        || die "--life-span must be [Nd][Nh][Nm][Ns] (1d, 6h, 90m) or seconds, got '$life_span'"
    # The stop needs stop_check_every steps and one checkpoint write; the margin also covers the job's
    # start-up before this script runs (the platform counts the life span from the job's start).
    margin=$(( life_s / 10 < 900 ? life_s / 10 : 900 ))
    if (( stop_after == 0 && life_s > 0 )); then stop_after=$(( life_s - margin > 1 ? life_s - margin : 1 )); fi
    # The time the stop has before the job's end: the trainer warns at its first checkpoint when writing one
    # takes longer (distqa.distributed.stop.graceful_stop_window).
    if (( stop_after > 0 && life_s > stop_after )); then export WORKER_STOP_WINDOW_S=$(( life_s - stop_after )); fi
fi
min_nodes="${min_nodes:-$nnodes}"
[[ -n "$node_rank" || -z "$engine_master_addr" ]] || die "--node-rank is required with an elastic PyTorchJob (PET_RDZV_ENDPOINT, no node rank):" \
    "pass the pod's replica index, as deploy/kubernetes/pytorchjob-elastic.yaml does"
# The engine's name for node 0 serves the other nodes; node 0 itself hosts the rendezvous at its own address, as on
# every launcher: a pod's DNS name may not resolve before the pod is ready. An external store is no engine's node:
# its address is --master-addr's alone.
if [[ -z "$master_addr" ]] && (( node_rank > 0 && ! external_store )); then master_addr="$engine_master_addr"; fi
for name in nnodes min_nodes node_rank master_port max_restarts join_timeout; do
    [[ "${!name}" =~ ^[0-9]+$ ]] || die "--${name//_/-} must be a whole number, got '${!name}'"
done
(( nnodes >= 1 )) || die "--nnodes must be at least 1"
(( min_nodes >= 1 && min_nodes <= nnodes )) || die "--min-nodes must be in 1..$nnodes (--nnodes), got $min_nodes"
for name in RDZV_LAST_CALL_TIMEOUT RDZV_KEEP_ALIVE_INTERVAL RDZV_KEEP_ALIVE_MAX_ATTEMPT; do
    [[ "${!name:-1}" =~ ^[1-9][0-9]*$ ]] || die "$name must be a positive whole number of seconds, got '${!name}'"
done
(( node_rank < nnodes )) || die "--node-rank $node_rank is outside 0..$(( nnodes - 1 )) for --nnodes $nnodes"
(( master_port >= 1024 && master_port <= 65535 )) || die "--master-port must be in 1024..65535, got $master_port"
[[ "$run_id" =~ ^[A-Za-z0-9._-]+$ ]] || die "--run-id may hold letters, digits, '.', '_' and '-' only, got '$run_id'"
[[ "$entry_point" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ ]] \
    || die "--entry-module must be a dotted Python module name such as mytask.train, got '$entry_point'"
# A failed check is the doctor's finding, not a fault: a restart would only run it again and print its table again.
if [[ "$entry_point" == distqa.doctor ]]; then max_restarts=0; fi
if (( external_store )) && [[ -z "$master_addr" ]]; then
    die "--external-store needs --master-addr: the address of the host running python -m distqa.launch.rendezvous_store"
fi
if (( node_rank > 0 )) && [[ -z "$master_addr" ]]; then
    die "--master-addr is required on node $node_rank: the address of node 0 (its internal hostname on the platform)"
fi

# The run directories (DISTQA_OUTPUT_DIR; the platform's results volume) and the hub cache (HF_HOME)
# must take files whoever owns their mounts: say so now, not as a traceback on some rank later.
require_writable worker.sh "${DISTQA_OUTPUT_DIR:-}" "${HF_HOME:-}"
# A fork's packages next to src/ (a task of examples/, say) import from any directory, on every node.
export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c "import distqa" 2>/dev/null \
    || die "$PYTHON cannot import distqa; run inside the image, or 'make setup' and PYTHON=.venv/bin/python"
"$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)" "$entry_point" \
    2>/dev/null || die "--entry-module $entry_point: no such module for $PYTHON (PYTHONPATH has the repository)"
if [[ -z "$nproc_per_node" ]]; then
    # torch sees no GPU where no GPU driver has its device node (NVIDIA's /dev/nvidiactl, WSL2's /dev/dxg, ROCm's
    # /dev/kfd): a CPU node skips importing torch just to count none (about 1.5 CPU-seconds a start).
    gpus=0
    if [[ -e /dev/nvidiactl || -e /dev/dxg || -e /dev/kfd ]]; then
        gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
    fi
    nproc_per_node=$(( gpus > 0 ? gpus : 1 ))
fi
[[ "$nproc_per_node" =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive whole number, got '$nproc_per_node'"

# PyTorch's flight recorder (torch 2.13: c10d/FlightRecorder.hpp, ProcessGroupNCCL.hpp): each rank keeps
# its last TORCH_FR_BUFFER_SIZE collectives, and when NCCL's watchdog times one out (dist_timeout_s) it
# dumps them to <TORCH_FR_DUMP_TEMP_FILE><rank>: into the run directory, so a hang leaves a record of
# which collective each rank was in. Read it with `torchfrtrace <run dir>/flight-recorder`
# (docs/FAULT_TOLERANCE.md, "Reading the flight recorder"). 2.13's names; it still reads TORCH_NCCL_TRACE_BUFFER_SIZE and
# TORCH_NCCL_DEBUG_INFO_TEMP_FILE, with a deprecation warning. The run directory is the trainer's own
# (its settings resolved as it will resolve them); a setting it refuses is left for the trainer to report.
if run_dir="$("$PYTHON" -m distqa.settings.sources --run-dir --run-name "$run_id" "${trainer_args[@]}" 2>/dev/null)" \
        && [[ -n "$run_dir" && "$run_dir" != *$'\n'* ]]; then
    flight_recorder="${TORCH_FR_DUMP_TEMP_FILE:-$run_dir/flight-recorder/rank_}"
    (( dry_run )) || mkdir -p "$(dirname "$flight_recorder")"
    export TORCH_FR_DUMP_TEMP_FILE="$flight_recorder"
    export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
    export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"
    # 3 (torch's default, stated): on a timeout or NCCL error the watchdog tears the process down, so
    # torchrun sees the failure instead of a rank hanging forever.
    export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-3}"
fi

# The node range, for the trainer's preflight and its membership lines (distqa.launch.elastic): torchrun tells a
# worker the node count of its round (GROUP_WORLD_SIZE), not the range.
export WORKER_NODE_RANGE="$min_nodes:$nnodes"
export WORKER_NODE="node $node_rank at ${NODE_ADDR:-$(hostname)}"
if (( min_nodes < nnodes )) && [[ "$entry_point" == distqa.train ]]; then
    # Before any rendezvous: a range with a world size that does not split the global batch is refused in one
    # line, instead of failing (and being restarted) at the first membership change.
    "$PYTHON" -m distqa.launch.elastic --procs-per-node "$nproc_per_node" -- --run-name "$run_id" "${trainer_args[@]}" \
        || exit 2
fi

# Workers get a fresh TCP store each rendezvous round instead of sharing the agent's: with the
# shared store a restarted worker can read the previous attempt's peer addresses (pytorch#135712).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
export PYTHONUNBUFFERED=1
# Each process gets its share of the node's cores instead of a thread per core (oversubscribed CPU
# runs are several times slower); emulated nodes on one machine pass their share as NODE_CORES.
if [[ -z "${OMP_NUM_THREADS:-}" ]]; then
    cores="${NODE_CORES:-$(nproc 2>/dev/null || echo 1)}"
    export OMP_NUM_THREADS=$(( cores / nproc_per_node > 1 ? cores / nproc_per_node : 1 ))
fi

# distqa.launch.agent is torchrun's agent (torch.distributed.run.main, same arguments) that says in one line
# which node never joined when the rendezvous times out, instead of a bare RendezvousTimeoutError.
launcher=("$PYTHON" -m distqa.launch.agent "$node_rank" --nproc-per-node "$nproc_per_node" --max-restarts "$max_restarts")
if (( nnodes == 1 )); then
    launcher+=(--standalone)
    where="1 node (standalone)"
else
    # The address this node is reached at: torchrun publishes it to the others, and the node that
    # gets group rank 0 also serves the workers' process-group store (MASTER_ADDR) there.
    node_addr="${NODE_ADDR:-$("$PYTHON" -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')}"
    if [[ "$node_addr" == 127.* && -z "${NODE_ADDR:-}" ]]; then
        echo "worker.sh: warning: this host's name resolves to $node_addr; other nodes cannot reach that." \
             "Set NODE_ADDR to this node's address." >&2
    fi
    # Node 0 hosts the store unless it runs elsewhere (--external-store): then every agent is a client.
    is_host=$(( node_rank == 0 && ! external_store ? 1 : 0 ))
    store_host="hosted by node 0"
    (( ! external_store )) || store_host="an external store"
    endpoint_host="${master_addr:-$node_addr}"
    rdzv_conf="is_host=$is_host,join_timeout=$join_timeout"
    [[ -z "${RDZV_LAST_CALL_TIMEOUT:-}" ]] || rdzv_conf+=",last_call_timeout=$RDZV_LAST_CALL_TIMEOUT"
    [[ -z "${RDZV_KEEP_ALIVE_INTERVAL:-}" ]] || rdzv_conf+=",keep_alive_interval=$RDZV_KEEP_ALIVE_INTERVAL"
    [[ -z "${RDZV_KEEP_ALIVE_MAX_ATTEMPT:-}" ]] || rdzv_conf+=",keep_alive_max_attempt=$RDZV_KEEP_ALIVE_MAX_ATTEMPT"
    node_count="$nnodes"
    (( min_nodes == nnodes )) || node_count="$min_nodes:$nnodes"
    launcher+=(--nnodes "$node_count" --rdzv-backend c10d --rdzv-endpoint "$endpoint_host:$master_port"
               --rdzv-id "$run_id" --rdzv-conf "$rdzv_conf" --local-addr "$node_addr")
    where="node $node_rank of $node_count at $node_addr, rendezvous $endpoint_host:$master_port ($store_host)"
fi
command=("${launcher[@]}" -m "$entry_point" --run-name "$run_id" "${trainer_args[@]}")

echo "worker.sh: run '$run_id': $where, $nproc_per_node process(es), max restarts $max_restarts$(
    (( stop_after > 0 )) && echo ", stop after ${stop_after}s")" >&2
if (( dry_run )); then
    printf '%q ' "${command[@]}"; echo
    exit 0
fi

# A node other than 0 (every node, with --external-store) first waits (up to the join timeout) until the rendezvous store accepts
# connections: a node started early just waits, and an unreachable one ends with one line naming
# address:port and what to check, instead of torchrun's RendezvousConnectionError traceback after 60 s.
if (( nnodes > 1 && (node_rank > 0 || external_store) )); then
    if ! message=$("$PYTHON" -m distqa.launch.reachability "$master_addr" "$master_port" "$join_timeout" 2>&1); then
        echo "worker.sh: run '$run_id' node $node_rank: $message" >&2
        exit 3
    fi
fi

rendezvous_timeout_status=4  # distqa.launch.agent.RENDEZVOUS_TIMEOUT_EXIT_CODE

# Workers stopped by a signal (distqa.distributed.stop: exit 75 after rank 0 wrote a checkpoint of the step reached)
# each leave one line here: torchrun itself exits with 1 whatever its workers' codes were.
stop_reports="$(mktemp -d "${TMPDIR:-/tmp}/distqa-stop.XXXXXX")"
export WORKER_STOP_REPORT_DIR="$stop_reports"
trap 'rm -rf "$stop_reports"' EXIT
# torchrun runs as a child rather than exec'd, so that its end can be reported. SIGTERM/SIGINT to this
# script (the platform ending the job, Slurm's --signal, Ctrl-C) go on to torchrun as SIGTERM, which it
# sends to its workers (who stop at the next check step), SIGKILLing them after
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT s (default 30). SIGTERM rather than SIGINT: a background child
# of a script starts with SIGINT ignored until torchrun installs its handlers.
"${command[@]}" &
agent=$!
trap 'kill -TERM "$agent" 2>/dev/null || true' TERM INT
if (( stop_after > 0 )); then
    (
        trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
        sleep "$stop_after" & sleeper=$!
        wait "$sleeper"
        echo "worker.sh: run '$run_id' node $node_rank: --stop-after ${stop_after}s reached: asking the workers to stop" >&2
        kill -TERM "$agent" 2>/dev/null || true
    ) &
    timer=$!
    trap 'kill "$timer" 2>/dev/null || true; rm -rf "$stop_reports"' EXIT
fi
set +e
wait "$agent"; status=$?
while (( status > 128 )) && kill -0 "$agent" 2>/dev/null; do  # a trapped signal cut the wait short
    wait "$agent"; status=$?
done
set -e
reports=("$stop_reports"/rank-*)
if [[ -f "${reports[0]}" ]]; then
    read -r report < "${reports[0]}"
    echo "worker.sh: run '$run_id' node $node_rank: $report" >&2
    exit 75
fi
# Workers that refused to run (a configuration or data error: distqa.errors.report_failure) said why and left
# exit-<CODE>-rank-<R> here; distqa.launch.agent then exits with their code instead of torchrun's 1 and its traceback.
if (( status != 0 )) && compgen -G "$stop_reports/exit-$status-rank-*" >/dev/null; then
    echo "worker.sh: run '$run_id' node $node_rank: the workers refused to run (exit $status); why is above$(
        [[ -n "${run_dir:-}" ]] && echo " and in $run_dir/logs/rank-*.log")" >&2
    exit "$status"
fi
if (( status != 0 && status != rendezvous_timeout_status )); then  # distqa.launch.agent said why in one line
    echo "worker.sh: run '$run_id' node $node_rank: torchrun exited with status $status (see above)" >&2
fi
exit "$status"
