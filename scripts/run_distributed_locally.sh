#!/usr/bin/env bash
# Emulate a multi-node DDP run on this machine: one scripts/worker.sh per "node" (NODE_ADDR=127.0.0.1),
# all joining one c10d rendezvous on 127.0.0.1 — the exact command each platform job, Slurm task and
# container runs, only without the network.
#
# Usage:
#   scripts/run_distributed_locally.sh [--nodes N] [--min-nodes MIN] [--procs-per-node M] [--port P]
#                                      [--run-id ID] [--max-restarts R] [--entry-module M] [--external-store]
#                                      [--] [TRAINER ARGS...]
#
#   scripts/run_distributed_locally.sh                            # 2 nodes × 1 process, tiny preset
#   scripts/run_distributed_locally.sh --nodes 3 -- --max-steps 20
#   scripts/run_distributed_locally.sh --nodes 3 --min-nodes 2 --max-restarts 3 -- --max-steps 200
#                                                                 # elastic: goes on with 2 if a node is lost
#   scripts/run_distributed_locally.sh -- --preset bert-base --device cuda   # GPUs, if present
#   scripts/run_distributed_locally.sh -- --task nq             # the committed NQ sample
#   scripts/run_distributed_locally.sh -- --task examples.text_classification.task:TextClassification
#                                                                 # a fork's task (examples/text_classification)
#
# Arguments after the launcher's own (or after --) go to `python -m distqa.train` unchanged; a task that
# builds its data first (--task nq: the feature cache) gets it built here, once (python -m distqa.prepare,
# reused when present). --entry-module M runs `python -m M` on every node instead of distqa.train (a
# fork's own entry point; worker.sh --entry-module), and then prepares nothing.
# --min-nodes MIN (worker.sh --min-nodes): the run goes on while MIN nodes are alive; a node that ends
# with an error then leaves the others running, and one started again by hand (scripts/worker.sh with the
# same --nnodes, --min-nodes, --node-rank, --master-addr 127.0.0.1, --master-port and --run-id) rejoins it.
# --external-store: the rendezvous store runs in a process of its own (python -m distqa.launch.rendezvous_store on
# 127.0.0.1:P, started first and stopped at the end) and every node is its client (worker.sh --external-store),
# so that with --min-nodes the loss of any node, node 0 included, leaves the others going.
# Environment: PYTHON (interpreter with distqa installed; default: .venv/bin/python if present,
# else python3), NODES, MIN_NODES, PROCS_PER_NODE, RDZV_PORT, RUN_ID, MAX_RESTARTS.
# Stopping: Ctrl-C, or SIGTERM (or SIGHUP) to the launcher, is a graceful stop: every node gets one
# SIGTERM, its workers checkpoint the step reached and exit 75, their lines are shown, and the launcher
# exits 75. A second Ctrl-C (or signal) stops every node at once.
# Exit status: 0 when every node finished; 75 when a node stopped on SIGTERM/SIGINT with a checkpoint
# of the step reached (worker.sh); otherwise the first failing node's status, after the remaining
# agents have been stopped (after an interrupt: 128 + the signal's number, 130 for Ctrl-C).
set -euo pipefail
(( BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1) )) \
    || { echo "run_distributed_locally.sh: needs bash >= 5.1 (wait -n -p)" >&2; exit 2; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
export PYTHON  # worker.sh uses the same interpreter
nodes="${NODES:-2}"
min_nodes="${MIN_NODES:-}"
procs_per_node="${PROCS_PER_NODE:-1}"
port="${RDZV_PORT:-29400}"
run_id="${RUN_ID:-local}"
max_restarts="${MAX_RESTARTS:-0}"
entry_module=distqa.train
external_store=0

die() { echo "run_distributed_locally.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }

trainer_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
        --min-nodes) need_value "$@"; min_nodes="$2"; shift 2 ;;
        --procs-per-node) need_value "$@"; procs_per_node="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --run-id) need_value "$@"; run_id="$2"; shift 2 ;;
        --max-restarts) need_value "$@"; max_restarts="$2"; shift 2 ;;
        --entry-module) need_value "$@"; entry_module="$2"; shift 2 ;;
        --external-store) external_store=1; shift ;;
        -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
        --) shift; trainer_args+=("$@"); break ;;
        *) trainer_args+=("$1"); shift ;;
    esac
done
min_nodes="${min_nodes:-$nodes}"
for name in nodes min_nodes procs_per_node port max_restarts; do
    [[ "${!name}" =~ ^[0-9]+$ ]] || die "--${name//_/-} must be a whole number, got '${!name}'"
done
(( nodes >= 1 && procs_per_node >= 1 )) || die "--nodes and --procs-per-node must be at least 1"
(( min_nodes >= 1 && min_nodes <= nodes )) || die "--min-nodes must be in 1..$nodes (--nodes), got $min_nodes"
(( port >= 1024 && port <= 65535 )) || die "--port must be in 1024..65535, got $port"
[[ "$run_id" =~ ^[A-Za-z0-9._-]+$ ]] || die "--run-id may hold letters, digits, '.', '_' and '-' only"
"$PYTHON" -c "import distqa" 2>/dev/null || die "$PYTHON cannot import distqa; run 'make setup' first"

# Gloo binds to the interface of the machine's hostname unless told otherwise; keep it on loopback.
if [[ -z "${GLOO_SOCKET_IFNAME:-}" && -d /sys/class/net/lo ]]; then export GLOO_SOCKET_IFNAME=lo; fi
# All emulated nodes share this machine's cores: each node gets its share (worker.sh splits it
# over its processes).
cores=$(nproc 2>/dev/null || echo 1)
export NODE_CORES=$(( cores / nodes > 1 ? cores / nodes : 1 ))

# What the task reads before training (NQ's features) is built here, once, before any rank starts: a rank
# featurising inside the run would leave the others waiting in a collective. Also fails fast on a
# configuration error.
if [[ "$entry_module" == distqa.train ]]; then
    PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}" \
        "$PYTHON" -m distqa.prepare --only-if-needed --run-name "$run_id" "${trainer_args[@]}" \
        || die "preparing the data failed (see above); nothing was launched"
fi

agents=()      # each node's worker.sh
store_pid=""   # python -m distqa.launch.rendezvous_store (--external-store)
stop_store() {
    [[ -n "$store_pid" ]] || return 0
    kill -TERM "$store_pid" 2>/dev/null || true
    wait "$store_pid" 2>/dev/null || true
    store_pid=""
}
prefixers=()   # the sed processes that put "[node N] " before each node's lines
any_alive() {  # any_alive PID...: whether one of them still runs (`kill -0 A B` fails when either is gone)
    local pid
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}
stop_agents() {
    # torchrun starts every worker in a session of its own and stops them itself (SIGTERM, then SIGKILL
    # after 30 s). Signal the workers directly too: a worker blocked in a collective would outlive an
    # agent that is SIGKILLed first. This is the forceful stop (a failed node, a second interrupt): a
    # worker that already got a SIGTERM ends at once on this one (distqa.distributed.stop).
    # Each node is worker.sh (exec'd into its Python process, the torchrun agent) → workers; up to three generations.
    local pid targets=() generation=("${agents[@]}")
    for _ in 1 2 3; do
        targets+=("${generation[@]}")
        local next=()
        for pid in "${generation[@]}"; do
            mapfile -t -O "${#next[@]}" next < <(pgrep -P "$pid" 2>/dev/null || true)
        done
        (( ${#next[@]} > 0 )) || break
        generation=("${next[@]}")
    done
    kill -TERM "${targets[@]}" 2>/dev/null || true
    # Up to 30 s for a clean exit (workers that got the signal first checkpoint the step they are at,
    # as under torchrun's own 30 s shutdown timeout), then force.
    for _ in $(seq 300); do
        any_alive "${targets[@]}" || return 0
        sleep 0.1
    done
    kill -KILL "${targets[@]}" 2>/dev/null || true
}

# A graceful stop passes exactly one signal to each worker: a second one ends a worker at once
# (distqa.distributed.stop). A terminal's Ctrl-C goes to the launcher's whole process group, and torchrun's agent
# passes every signal it gets on to its workers; so each node runs in a session of its own (setsid),
# out of reach of the terminal, and this launcher alone decides what it gets: one SIGTERM to its
# worker.sh, which passes it to its agent, which passes it to its workers.
interrupted=""  # the signal that asked for a graceful stop
# shellcheck disable=SC2329  # called by the traps below
interrupt() {  # interrupt NAME NUMBER
    if [[ -z "$interrupted" ]]; then
        interrupted="$1"
        echo "interrupted (SIG$1): every node checkpoints the step it reaches and stops (exit 75);" \
             "press Ctrl-C again to stop at once" >&2
        kill -TERM "${agents[@]}" 2>/dev/null || true
        return
    fi
    echo "interrupted again (SIG$1): stopping every node at once" >&2
    trap '' INT TERM HUP
    stop_agents
    finish_output
    exit $(( 128 + $2 ))
}
finish_output() {
    # The prefixers end once every process of their node has closed its output; waiting for them
    # shows each node's last lines (the workers' "stopped by" lines) before the launcher returns.
    # Bounded: a process that outlives its node (stop_agents gave up on it) would hold them open.
    for _ in $(seq 100); do
        any_alive "${prefixers[@]}" || break
        sleep 0.1
    done
    if (( ${#prefixers[@]} > 0 )); then
        kill "${prefixers[@]}" 2>/dev/null || true
        wait "${prefixers[@]}" 2>/dev/null || true
    fi
    rm -rf "$pipes"
}
pipes="$(mktemp -d "${TMPDIR:-/tmp}/distqa-launcher.XXXXXX")"  # a named pipe per node and stream
trap 'interrupt INT 2' INT
trap 'interrupt TERM 15' TERM
trap 'interrupt HUP 1' HUP
trap stop_store EXIT

worker_store_args=()
if (( external_store )); then
    # The store first, in a session of its own (out of reach of the terminal's Ctrl-C, like the nodes): every
    # node connects to it, and it outlives any of them. Its port is --port; the nodes wait for it (distqa.launch.reachability).
    PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}" setsid "$PYTHON" -m distqa.launch.rendezvous_store \
        --host 127.0.0.1 --port "$port" &
    store_pid=$!
    "$PYTHON" -m distqa.launch.reachability 127.0.0.1 "$port" 60 >/dev/null \
        || { stop_store; die "the rendezvous store (python -m distqa.launch.rendezvous_store --port $port) did not start; see above"; }
    worker_store_args=(--external-store)
fi

echo "launching $nodes node(s) × $procs_per_node process(es), rendezvous 127.0.0.1:$port, run id '$run_id'" >&2
for (( node = 0; node < nodes; node++ )); do
    # The prefixers are this launcher's own children (not the node's), reading a named pipe each: a
    # forceful stop of the node leaves them running to show its last lines.
    mkfifo "$pipes/$node.out" "$pipes/$node.err"
    sed -u "s/^/[node $node] /" < "$pipes/$node.out" &
    prefixers+=("$!")
    sed -u "s/^/[node $node] /" < "$pipes/$node.err" >&2 &
    prefixers+=("$!")
    # Node 0 hosts the rendezvous store (unless --external-store), as the master job does on the platform; worker.sh runs
    # the torchrun agent as its child and passes SIGTERM/SIGINT on to it. setsid keeps the PID of
    # worker.sh ($!): a background child of a script leads no process group, so setsid does not fork.
    NODE_ADDR=127.0.0.1 setsid bash "$repo_root/scripts/worker.sh" --nnodes "$nodes" --min-nodes "$min_nodes" \
        --node-rank "$node" \
        --master-addr 127.0.0.1 --master-port "$port" --run-id "$run_id" --max-restarts "$max_restarts" \
        "${worker_store_args[@]}" --nproc-per-node "$procs_per_node" --entry-module "$entry_module" -- "${trainer_args[@]}" \
        > "$pipes/$node.out" 2> "$pipes/$node.err" &
    agents+=("$!")
done

status=0
running=("${agents[@]}")
while (( ${#running[@]} > 0 )); do
    finished_pid=""
    # errexit off around the wait: bash 5.2 exits when a trapped signal (an interrupt) cuts short a
    # `wait` under set -e, even one guarded by ||.
    set +e
    wait -n -p finished_pid "${running[@]}"
    code=$?
    set -e
    [[ -n "${finished_pid:-}" ]] || continue  # a trapped signal cut the wait short (interrupt)
    mapfile -t running < <(printf '%s\n' "${running[@]}" | grep -vx -- "$finished_pid")
    if (( code == 75 )); then
        # Stopped on a signal at a step boundary (see worker.sh): the checkpoint is complete and the
        # other nodes stop by the same agreement. Signalling them now would be a second signal, which
        # ends a worker at once (distqa.distributed.stop), so they get 60 s to end by themselves.
        echo "a node stopped with a checkpoint of the step reached (exit 75): waiting for the others;" \
             "run again with --run-id $run_id to resume" >&2
        status=$code
        for _ in $(seq 600); do
            any_alive "${running[@]}" || break
            sleep 0.1
        done
        (( ${#running[@]} == 0 )) || stop_agents
        break
    elif (( code != 0 )) && [[ -z "$interrupted" ]] && (( min_nodes < nodes && ${#running[@]} >= min_nodes )); then
        # Elastic (--min-nodes): the others meet in a new rendezvous round without this node.
        for (( node = 0; node < nodes; node++ )); do [[ "${agents[node]}" != "$finished_pid" ]] || break; done
        echo "node $node exited with status $code; the other ${#running[@]} node(s) go on (--min-nodes $min_nodes)" >&2
    elif (( code != 0 )); then
        if [[ -n "$interrupted" ]]; then
            echo "a node ended with status $code after the interrupt: stopping the others" >&2
        else
            echo "a node exited with status $code: stopping the others" >&2
        fi
        status=$code
        stop_agents
        break
    fi
done
trap '' INT TERM HUP  # the nodes have ended; only their last lines are left to show
wait "${agents[@]}" 2>/dev/null || true
finish_output
if [[ -n "$interrupted" && "$status" != 75 && "$status" != 0 ]]; then  # 0: the run ended before the stop
    case "$interrupted" in INT) status=130 ;; TERM) status=143 ;; *) status=129 ;; esac
fi
stop_store
exit "$status"
