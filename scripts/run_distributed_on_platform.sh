#!/usr/bin/env bash
# One command, N-node DDP training on the Apolo (ex-Neu.ro) platform: starts the master job, waits
# until it runs and reads its internal hostname, starts N-1 worker jobs pointed at it (all jobs of
# .neuro/live.yml's `distributed_training`, sharing one run id), streams the master's logs, and
# kills every job of the run as soon as one fails or you press Ctrl-C.
#
# Usage:
#   scripts/run_distributed_on_platform.sh [--nodes N] [--preset NAME] [--run-id ID] [--port P]
#       [--max-restarts R] [--life-span SPAN] [--timeout S] [--poll S] [--dry-run] [--] [TRAINER ARGS...]
#
#   scripts/run_distributed_on_platform.sh --nodes 2                       # DummyDataset, tiny model
#   scripts/run_distributed_on_platform.sh --nodes 4 --preset gpu-large -- --preset bert-base
#   scripts/run_distributed_on_platform.sh --nodes 4 -- --preset bert-base-nq \
#       --nq-train-file /data/simplified-nq-train.jsonl --nq-cache-dir /project/results/nq-cache
#                                             # NQ, after `neuro-flow run prepare` (README "Run on the platform")
#   scripts/run_distributed_on_platform.sh --run-id dq-0612 -- --preset bert-base   # resume that run
#
# Before the first run: neuro-flow build myimage; neuro-flow mkvolumes; neuro-flow upload ALL.
#
# Options:
#   --nodes N          jobs (nodes) in the run; default: $NODES, else NODES= in .env, else 2
#   --preset NAME      resource preset of every node; default: $PLATFORM_PRESET, .env, else gpu-small
#   --run-id ID        job suffix, rendezvous id and run directory (results/ID); the same id
#                      resumes that run. Default: dq-<UTC date-time>. Lowercase letters, digits, '-'.
#   --port P           rendezvous port on the master (default 29400)
#   --max-restarts R   torchrun restarts after a worker failure, inside the jobs (default 0)
#   --life-span SPAN   each job is killed by the platform after SPAN (default 1d): a safety net
#   --timeout S        seconds to wait for the master to run (default 900; scheduling a GPU node
#                      can take minutes)
#   --poll S           seconds between status checks of the jobs (default 15)
#   --dry-run          print the commands instead of running them
# Arguments after -- go to the trainer (python -m distqa.train) on every node.
#
# Environment: FLOW_CLI (apolo-flow or neuro-flow; default: whichever is installed, apolo-flow
# first), NODES, PLATFORM_PRESET, RUN_ID, MASTER_TIMEOUT, POLL_INTERVAL; ENV_FILE (default .env
# in the repository: NODES= and PLATFORM_PRESET= are read from it).
# Exit status: 0 when every node succeeded; 1 when a job failed or never started (all jobs of the
# run are killed first); 2 for a usage error; 130 after Ctrl-C (all jobs killed).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/platform_common.sh
source "$repo_root/scripts/platform_common.sh"

job=distributed_training
nodes="$(setting NODES 2)"
preset="$(setting PLATFORM_PRESET gpu-small)"
run_id="${RUN_ID:-dq-$(date -u +%m%d-%H%M%S)}"
port=29400
max_restarts=0
life_span=1d
timeout_s="${MASTER_TIMEOUT:-900}"
poll_s="${POLL_INTERVAL:-15}"
dry_run=0

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "run_distributed_on_platform.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
log() { echo "[platform] $*" >&2; }

trainer_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
        --preset) need_value "$@"; preset="$2"; shift 2 ;;
        --run-id) need_value "$@"; run_id="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --max-restarts) need_value "$@"; max_restarts="$2"; shift 2 ;;
        --life-span) need_value "$@"; life_span="$2"; shift 2 ;;
        --timeout) need_value "$@"; timeout_s="$2"; shift 2 ;;
        --poll) need_value "$@"; poll_s="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; trainer_args+=("$@"); break ;;
        *) die "unknown option '$1'; trainer flags go after -- (see --help)" ;;
    esac
done
for name in nodes port max_restarts timeout_s; do
    [[ "${!name}" =~ ^[0-9]+$ ]] || die "${name} must be a whole number, got '${!name}' (flag, environment or .env)"
done
[[ "$poll_s" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--poll must be a number of seconds, got '$poll_s'"
(( nodes >= 1 )) || die "--nodes must be at least 1, got $nodes"
(( port >= 1024 && port <= 65535 )) || die "--port must be in 1024..65535, got $port"
[[ "$run_id" =~ ^[a-z0-9][a-z0-9-]{0,19}$ ]] \
    || die "--run-id must be 1-20 lowercase letters, digits or '-' (it becomes part of job names), got '$run_id'"
[[ "$life_span" =~ ^([0-9]+[dhms])+$ ]] || die "--life-span looks like 1d, 6h or 1d12h, got '$life_span'"

# The trainer flags travel as one param and are split again like a shell would (neuro-flow splits
# the job's command with shlex), so quote each one.
quote() {
    local arg out=()
    for arg in "$@"; do
        if [[ "$arg" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=("$arg"); else out+=("'${arg//\'/\'\\\'\'}'"); fi
    done
    echo "${out[*]}"
}
args_param="$(quote "${trainer_args[@]}")"

if (( dry_run )); then
    flow="${FLOW_CLI:-neuro-flow}"
else
    flow="$(find_flow_cli)" || exit 2
fi
suffix_of() { echo "$run_id-$1"; }
run_command() {  # run_command NODE_RANK MASTER_ADDR: the command that starts one node's job
    local rank="$1" master="$2"
    printf '%s\n' "$flow" run "$job" --suffix "$(suffix_of "$rank")" \
        --param nodes "$nodes" --param node_rank "$rank" --param master_addr "$master" \
        --param master_port "$port" --param run_id "$run_id" --param max_restarts "$max_restarts" \
        --param preset "$preset" --param life_span "$life_span" --param args "$args_param"
}

if (( dry_run )); then
    for (( rank = 0; rank < nodes; rank++ )); do
        mapfile -t cmd < <(run_command "$rank" "$( (( rank == 0 )) || echo '<master-internal-hostname>')")
        quote "${cmd[@]}"
        if (( rank == 0 )); then
            echo "$flow status $job $(suffix_of 0)   # until running; read its Internal Hostname"
        fi
    done
    echo "$flow logs $job $(suffix_of 0)"
    echo "# on failure or Ctrl-C, for every node I: $flow kill $job $run_id-I"
    exit 0
fi

started=()      # suffixes of the jobs started so far (killed on failure or interrupt)
logs_pid=""
kill_run() {
    local suffix
    trap '' INT TERM  # finish the clean-up even if Ctrl-C is pressed again
    if [[ -n "$logs_pid" ]]; then kill "$logs_pid" 2>/dev/null || true; fi
    for suffix in "${started[@]}"; do
        log "killing $job $suffix"
        "$flow" kill "$job" "$suffix" >/dev/null 2>&1 || log "could not kill $job $suffix: run '$flow kill $job $suffix'"
    done
}
fail() { log "$*"; log "stopping every job of run '$run_id'"; kill_run; exit 1; }
trap 'log "interrupted"; kill_run; exit 130' INT TERM

# job_status SUFFIX: prints "STATUS HOSTNAME" from `<flow> status` (the platform's job table);
# STATUS is "unknown" when the job cannot be found or the output cannot be read.
job_status() {
    local out state host
    out="$("$flow" status "$job" "$1" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g')" || true
    state="$(awk '$1 == "Status" { print $2; exit }' <<<"$out")"
    host="$(awk '$1 == "Internal" && $2 == "Hostname" && NF == 3 { print $3; exit }' <<<"$out")"
    echo "${state:-unknown} ${host:--}"
}

start_node() {  # start_node NODE_RANK MASTER_ADDR
    local cmd
    mapfile -t cmd < <(run_command "$1" "$2")
    started+=("$(suffix_of "$1")")
    "${cmd[@]}" >&2 || fail "could not start node $1: '${cmd[*]}' exited with status $?"
}

log "run '$run_id': $nodes node(s), preset $preset, via $flow; results in results/$run_id on storage"
start_node 0 ""

# Wait for the master to run and to have an internal hostname; the others connect to it.
deadline=$(( SECONDS + timeout_s ))
master_host=""
while :; do
    read -r state host < <(job_status "$(suffix_of 0)")
    case "$state" in
        running) if [[ "$host" != "-" ]]; then master_host="$host"; break; fi ;;
        succeeded|failed|cancelled)
            fail "the master job ended ($state) before the workers started; see '$flow logs $job $(suffix_of 0)'" ;;
    esac
    if (( SECONDS >= deadline )); then
        fail "the master job is not running after ${timeout_s} s (last status: $state); is preset '$preset'" \
             "available ('apolo config show')? Raise --timeout to wait longer for a node."
    fi
    sleep "$poll_s"
done
log "master $job $(suffix_of 0) is running at $master_host"
for (( rank = 1; rank < nodes; rank++ )); do
    start_node "$rank" "$master_host"
done

"$flow" logs "$job" "$(suffix_of 0)" &
logs_pid=$!

# Watch every job: one failed or cancelled job ends the run; all succeeded is success.
unknown_streak=0
while :; do
    sleep "$poll_s"
    succeeded=0 unknown=0
    for (( rank = 0; rank < nodes; rank++ )); do
        read -r state _ < <(job_status "$(suffix_of "$rank")")
        case "$state" in
            succeeded) succeeded=$(( succeeded + 1 )) ;;
            failed|cancelled) fail "node $rank ($job $(suffix_of "$rank")) $state; its logs: '$flow logs $job $(suffix_of "$rank")'" ;;
            unknown) unknown=$(( unknown + 1 )) ;;
        esac
    done
    if (( succeeded == nodes )); then break; fi
    # A status that cannot be read once is a network hiccup; for many checks in a row, the job is gone.
    if (( unknown > 0 )); then unknown_streak=$(( unknown_streak + 1 )); else unknown_streak=0; fi
    (( unknown_streak < 20 )) || fail "the status of $unknown job(s) could not be read 20 times in a row"
done
wait "$logs_pid" 2>/dev/null || true
trap - INT TERM
log "run '$run_id' finished on all $nodes nodes; checkpoints in results/$run_id/checkpoints on storage" \
    "('$flow download results' fetches them)"
