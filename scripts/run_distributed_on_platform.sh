#!/usr/bin/env bash
# One command, N-node DDP training on the Apolo (ex-Neu.ro) platform: checks the platform job name of
# every node, starts the master job, waits until it runs and reads its internal hostname, starts the
# N-1 worker jobs pointed at it all at once (all jobs of .neuro/live.yml's `distributed_training`,
# sharing one run id), streams the master's logs, and kills every job of the run as soon as one
# fails or you press Ctrl-C. With --external-store a CPU job (`rendezvous_store`) hosts the rendezvous
# instead: it starts first, and all N nodes then start together pointed at it. Works from any directory
# (the flow CLI runs in the repository).
#
# Usage:
#   scripts/run_distributed_on_platform.sh [--nodes N] [--min-nodes MIN] [--max-resubmits K] [--preset NAME]
#       [--external-store] [--store-preset NAME]
#       [--run-id ID] [--port P] [--max-restarts R] [--life-span SPAN] [--timeout S] [--poll S] [--entry-module M]
#       [--tracker none|mlflow] [--mlflow-uri URI] [--mlflow-token secret:NAME] [--dry-run] [--] [TRAINER ARGS...]
#
#   scripts/run_distributed_on_platform.sh --nodes 2                       # DummyDataset, tiny model
#   scripts/run_distributed_on_platform.sh --nodes 4 --preset gpu-large -- --preset bert-base
#   scripts/run_distributed_on_platform.sh --nodes 4 -- --preset bert-base-nq \
#       --nq-train-file /data/simplified-nq-train.jsonl --nq-cache-dir /project/results/nq-cache
#                                             # NQ, after `neuro-flow run prepare` (docs/PLATFORM.md)
#   scripts/run_distributed_on_platform.sh --run-id dq-0612 -- --preset bert-base   # resume that run
#   scripts/run_distributed_on_platform.sh --nodes 4 --min-nodes 3 --external-store -- --preset bert-base
#                                             # elastic: the loss of any node, node 0 too, leaves the run going
#
# Before the first run: neuro-flow build myimage; neuro-flow mkvolumes; neuro-flow upload ALL.
#
# Options:
#   --nodes N          jobs (nodes) in the run; default: $NODES, else NODES= in .env, else 2
#   --min-nodes MIN    elastic (worker.sh --min-nodes; default: $MIN_NODES, else .env, else N): the run goes
#                      on while MIN jobs are alive. A job that fails or is cancelled then does not end the
#                      run: the others resume at the smaller world size, and the launcher submits that
#                      node's job again (same arguments, same node rank; --max-resubmits), whose worker
#                      joins the next rendezvous round: the run grows back (docs/FAULT_TOLERANCE.md).
#                      Node 0 hosts the rendezvous store: its job is not submitted again, and its loss ends
#                      the run, unless --external-store
#   --max-resubmits K  with --min-nodes below --nodes: submit each node's job again at most K times
#                      (default 3; 0: never); after that the run goes on without the node while MIN
#                      jobs are alive. Without a range a failed job ends the run, as ever
#   --preset NAME      resource preset of every node; default: $PLATFORM_PRESET, .env, else gpu-small
#   --external-store   host the rendezvous store in a CPU job of its own (`rendezvous_store <run id>`, running
#                      python -m distqa.launch.rendezvous_store --port P), submitted before the nodes and killed at the
#                      end, instead of on node 0 (default: $EXTERNAL_STORE, .env, else 0; 1 = on). Use it with
#                      --min-nodes: node 0 is then a node like any other, whose job is submitted again when
#                      lost. It costs one small CPU job for the run's length; losing that job ends the run
#   --store-preset P   resource preset of the store's job (default: $STORE_PRESET, .env, else cpu-small)
#   --run-id ID        job suffix, rendezvous id and run directory (results/ID); the same id
#                      resumes that run. Default: dq-<UTC date-time>. Lowercase letters and digits
#                      in groups joined by single '-'; short enough that every node's platform job
#                      name (<project id>-distributed-training-<ID>-<node>, cut as neuro-flow cuts
#                      it) fits the platform's 40 characters: at most 15 characters below 10 nodes.
#   --port P           rendezvous port on the master, or on the store's job (default 29400)
#   --max-restarts R   torchrun restarts of every worker from the newest checkpoint after one fails,
#                      inside the jobs (default 3: a crashed process costs a restart, not the run; a
#                      job that ends still ends the run; docs/FAULT_TOLERANCE.md "Restart defaults")
#   --life-span SPAN   each job is killed by the platform after SPAN (default 1d): a safety net.
#                      As neuro-flow reads it: [Nd][Nh][Nm][Ns] in that order (1d, 6h, 1d12h, 90m)
#                      or a number of seconds (3600)
#   --timeout S        seconds the platform may take to start each node (default 900: autoscaled
#                      GPU nodes can take minutes); a node not started by then fails (the job's
#                      schedule_timeout) and the run stops. The master's rendezvous waits S + 300 s
#                      for the others to join, so a worker queued up to S still makes it.
#   --poll S           seconds between status checks of the jobs (default 15)
#   --entry-module M   the module every process of every node runs (python -m M; default distqa.train):
#                      a fork's own entry point (worker.sh --entry-module); the image must hold it
#   --tracker T        'mlflow': rank 0 logs the run to the MLflow server at --mlflow-uri (one MLflow run
#                      across restarts; docs/PLATFORM.md "Tracking with MLflow"); default: DISTQA_TRACKER
#                      (environment or .env), else none
#   --mlflow-uri URI   the MLflow tracking server, e.g. the platform's MLflow app; default: MLFLOW_TRACKING_URI
#                      (environment or .env)
#   --mlflow-token S   a platform secret holding the server's token, as secret:NAME (`apolo secret add NAME
#                      TOKEN`); the jobs get it as MLFLOW_TRACKING_TOKEN. Default: MLFLOW_TOKEN_SECRET
#                      (environment or .env), else none. Never the token itself: job params are visible
#   --dry-run          print the commands instead of running them
# Arguments after -- go to the trainer (python -m distqa.train, or --entry-module) on every node; a fork's
# task is one of them: -- --task examples.text_classification.task:TextClassification.
#
# Environment: FLOW_CLI (apolo-flow or neuro-flow; default: whichever is installed, apolo-flow
# first), NODES, MIN_NODES, PLATFORM_PRESET, EXTERNAL_STORE, STORE_PRESET, RUN_ID, SCHEDULE_TIMEOUT,
# POLL_INTERVAL; ENV_FILE (default .env in the working directory, as for every script and entry point: NODES=,
# MIN_NODES=, PLATFORM_PRESET=, EXTERNAL_STORE= and STORE_PRESET= are read from it).
# Exit status: 0 when every node succeeded; 1 when a job failed or never started, or the store's job
# ended (all jobs of the run are killed first); 2 for a usage error; 130 after Ctrl-C or SIGTERM (all
# jobs killed: each job's worker.sh gets SIGTERM from the platform, so its workers checkpoint the step
# reached and stop within the platform's grace period; run again with the same --run-id to resume).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"

job=distributed_training
nodes="$(setting NODES 2)"
min_nodes="$(setting MIN_NODES "")"
preset="$(setting PLATFORM_PRESET gpu-small)"
external_store="$(setting EXTERNAL_STORE 0)"
store_preset="$(setting STORE_PRESET cpu-small)"
store_job=rendezvous_store  # .neuro/live.yml's job that runs python -m distqa.launch.rendezvous_store (--external-store)
run_id="${RUN_ID:-dq-$(date -u +%m%d-%H%M%S)}"
port=29400
max_restarts=3
max_resubmits=3
life_span=1d
timeout_s="${SCHEDULE_TIMEOUT:-900}"
join_margin_s=300  # after a worker is scheduled: image pull, container start, python imports
poll_s="${POLL_INTERVAL:-15}"
dry_run=0
entry_module=distqa.train
tracker="$(setting DISTQA_TRACKER none)"
mlflow_uri="$(setting MLFLOW_TRACKING_URI "")"
mlflow_token="$(setting MLFLOW_TOKEN_SECRET "")"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "run_distributed_on_platform.sh: $*" >&2; exit 2; }
need_value() { [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a value (see --help)"; }
log() { echo "[platform] $*" >&2; }

trainer_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) need_value "$@"; nodes="$2"; shift 2 ;;
        --min-nodes) need_value "$@"; min_nodes="$2"; shift 2 ;;
        --preset) need_value "$@"; preset="$2"; shift 2 ;;
        --external-store) external_store=1; shift ;;
        --store-preset) need_value "$@"; store_preset="$2"; shift 2 ;;
        --run-id) need_value "$@"; run_id="$2"; shift 2 ;;
        --port) need_value "$@"; port="$2"; shift 2 ;;
        --max-restarts) need_value "$@"; max_restarts="$2"; shift 2 ;;
        --max-resubmits) need_value "$@"; max_resubmits="$2"; shift 2 ;;
        --life-span) need_value "$@"; life_span="$2"; shift 2 ;;
        --entry-module) need_value "$@"; entry_module="$2"; shift 2 ;;
        --tracker) need_value "$@"; tracker="$2"; shift 2 ;;
        --mlflow-uri) need_value "$@"; mlflow_uri="$2"; shift 2 ;;
        --mlflow-token) need_value "$@"; mlflow_token="$2"; shift 2 ;;
        --timeout) need_value "$@"; timeout_s="$2"; shift 2 ;;
        --poll) need_value "$@"; poll_s="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; trainer_args+=("$@"); break ;;
        *) die "unknown option '$1'; trainer flags go after -- (see --help)" ;;
    esac
done
min_nodes="${min_nodes:-$nodes}"
for name in nodes min_nodes port max_restarts max_resubmits timeout_s; do
    [[ "${!name}" =~ ^[0-9]+$ ]] || die "${name} must be a whole number, got '${!name}' (flag, environment or .env)"
done
[[ "$poll_s" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--poll must be a number of seconds, got '$poll_s'"
[[ "$external_store" == 0 || "$external_store" == 1 ]] \
    || die "EXTERNAL_STORE must be 0 or 1 (1: --external-store), got '$external_store' (environment or .env)"
(( ! external_store || nodes > 1 )) || die "--external-store needs --nodes 2 or more: one node has no rendezvous to host"
(( nodes >= 1 )) || die "--nodes must be at least 1, got $nodes"
(( min_nodes >= 1 && min_nodes <= nodes )) || die "--min-nodes must be in 1..$nodes (--nodes), got $min_nodes"
(( port >= 1024 && port <= 65535 )) || die "--port must be in 1024..65535, got $port"
(( timeout_s >= 1 )) || die "--timeout must be at least 1 second, got $timeout_s"
[[ "$entry_module" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$ ]] \
    || die "--entry-module must be a dotted Python module name such as mytask.train, got '$entry_module'"
[[ "$tracker" == none || "$tracker" == mlflow ]] || die "--tracker must be none or mlflow, got '$tracker'"
[[ "$tracker" == none || -n "$mlflow_uri" ]] \
    || die "--tracker mlflow needs --mlflow-uri (or MLFLOW_TRACKING_URI in the environment or .env)"
[[ -z "$mlflow_token" || "$mlflow_token" =~ ^secret:[A-Za-z0-9_-]+$ ]] \
    || die "--mlflow-token must name a platform secret as secret:NAME (not the token itself: job params are visible)"
[[ "$run_id" =~ ^[a-z0-9]+(-[a-z0-9]+)*$ ]] \
    || die "--run-id must be lowercase letters and digits in groups joined by single '-' (it becomes part of job names), got '$run_id'"
# The flow CLI reads a job's life_span as a number of seconds (Python's float, then int) or as
# d/h/m/s parts in that order (apolo_flow.expr.OptTimeDeltaExpr); anything else fails there after
# some nodes have started. (Of float's rarer spellings - blanks, '_', 3-digit exponents - none is taken.)
[[ "$life_span" =~ ^\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,2})?$ \
   || ( "$life_span" =~ ^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$ && -n "$life_span" ) ]] \
    || die "--life-span must be [Nd][Nh][Nm][Ns] in that order (1d, 6h, 1d12h, 90m) or seconds (3600), got '$life_span'"
join_timeout_s=$(( timeout_s + join_margin_s ))

# The platform job name of each node, built as neuro-flow builds it (apolo_flow.live_runner.
# LiveExecutor.run): project id, '-', then job id and suffix with '_' as '-', the project id cut so
# the whole is at most 40 characters. `apolo run` refuses a name that is not
# ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ of 3..40 characters (apolo_cli.click_types.JOB_NAME), so check every
# node's name before starting any: otherwise nodes 0..9 start and node 10 is refused.
config_dir=.neuro
[[ -d "$repo_root/.apolo" ]] && config_dir=.apolo  # neuro-flow looks for .apolo/ first
project_id="$(sed -n -e 's/^id:[[:space:]]*\([A-Za-z0-9_-]*\).*/\1/p' "$repo_root/$config_dir/project.yml" 2>/dev/null | head -n 1)"
[[ -n "$project_id" ]] || die "no 'id:' in $repo_root/$config_dir/project.yml: the project id names the jobs"
collapse() {  # collapse TEXT: '_' -> '-', no leading/trailing '-', no '--' (as LiveExecutor.run)
    local text="${1//_/-}"
    while [[ "$text" == -* ]]; do text="${text#-}"; done
    while [[ "$text" == *- ]]; do text="${text%-}"; done
    while [[ "$text" == *--* ]]; do text="${text//--/-}"; done
    echo "$text"
}
job_name() {  # job_name SUFFIX [JOB]: the platform name of the job `run JOB --suffix SUFFIX` (JOB: distributed_training)
    local first second keep name
    first="$(collapse "$project_id")"
    second="$(collapse "${2:-$job}-$1")"
    keep=$(( 40 - ${#second} - 1 ))  # Python's first[:keep]: a negative keep counts from the end
    if (( keep < 0 )); then keep=$(( ${#first} + keep > 0 ? ${#first} + keep : 0 )); fi
    name="${first:0:keep}-$second"
    while [[ "$name" == *--* ]]; do name="${name//--/-}"; done
    echo "$name"
}
for (( rank = nodes - 1; rank >= 0; rank-- )); do  # the longest suffix first
    name="$(job_name "$run_id-$rank")"
    if (( ${#name} < 3 || ${#name} > 40 )) || ! [[ "$name" =~ ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ ]]; then
        longest=$(( 38 - ${#job} - 1 - ${#rank} - 1 ))
        die "node $rank's job name '$name' is not a valid platform job name (at most 40 characters," \
            "^[a-z][a-z0-9]*(-[a-z0-9]+)*\$); with $nodes nodes use a --run-id of at most $longest characters"
    fi
done
if (( external_store )); then  # shorter than every node's name, but its own job id: checked all the same
    name="$(job_name "$run_id" "$store_job")"
    (( ${#name} >= 3 && ${#name} <= 40 )) && [[ "$name" =~ ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ ]] \
        || die "the store's job name '$name' is not a valid platform job name (at most 40 characters); use a shorter --run-id"
fi

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
store_on="false"
(( ! external_store )) || store_on="true"
run_command() {  # run_command NODE_RANK MASTER_ADDR: the command that starts one node's job
    local rank="$1" master="$2"
    printf '%s\n' "$flow" run "$job" --suffix "$(suffix_of "$rank")" \
        --param nodes "$nodes" --param min_nodes "$min_nodes" --param node_rank "$rank" --param master_addr "$master" \
        --param master_port "$port" --param external_store "$store_on" --param run_id "$run_id" \
        --param max_restarts "$max_restarts" \
        --param preset "$preset" --param life_span "$life_span" --param schedule_timeout "$timeout_s" \
        --param join_timeout "$join_timeout_s" --param entry_module "$entry_module" --param tracker "$tracker" \
        --param mlflow_uri "$mlflow_uri" --param mlflow_token "$mlflow_token" --param args "$args_param"
}
# The store's job lives as long as a node's: it starts before every node, and the run stops itself (each node's
# worker.sh, a tenth of the life span early) before the first node's life span ends.
store_command() {
    printf '%s\n' "$flow" run "$store_job" --suffix "$run_id" --param port "$port" --param run_id "$run_id" \
        --param preset "$store_preset" --param life_span "$life_span" --param schedule_timeout "$timeout_s"
}

# The flow CLI finds .neuro/live.yml from its working directory up (apolo_flow.parser.find_workspace).
cd "$repo_root"
if (( dry_run && external_store )); then
    mapfile -t cmd < <(store_command)
    echo "$(quote "${cmd[@]}") &"
    echo "$flow status $store_job $run_id   # until running; read its Internal Hostname"
    for (( rank = 0; rank < nodes; rank++ )); do
        mapfile -t cmd < <(run_command "$rank" '<store-internal-hostname>')
        echo "$(quote "${cmd[@]}") &   # nodes 0..N-1 all at once"
    done
    echo "$flow logs $job $(suffix_of 0)"
    echo "# at the end (and on failure or Ctrl-C): for every node I: $flow kill $job $run_id-I; then $flow kill $store_job $run_id"
    exit 0
elif (( dry_run )); then
    for (( rank = 0; rank < nodes; rank++ )); do
        mapfile -t cmd < <(run_command "$rank" "$( (( rank == 0 )) || echo '<master-internal-hostname>')")
        if (( rank == 0 )); then
            echo "$(quote "${cmd[@]}") &"
            echo "$flow status $job $(suffix_of 0)   # until running; read its Internal Hostname"
        else
            echo "$(quote "${cmd[@]}") &   # nodes 1..N-1 all at once"
        fi
    done
    echo "$flow logs $job $(suffix_of 0)"
    echo "# on failure or Ctrl-C, for every node I: $flow kill $job $run_id-I"
    exit 0
fi

started=()      # suffixes of the nodes' jobs started so far (killed on failure or interrupt)
store_started=0 # 1 once the store's job was submitted (--external-store): killed after the nodes' jobs
submitting=()   # pids of `<flow> run` commands still waiting for their job to start
logs_pid=""
kill_store() {
    log "killing $store_job $run_id (the rendezvous store)"
    "$flow" kill "$store_job" "$run_id" >/dev/null 2>&1 \
        || log "could not kill $store_job $run_id: run '$flow kill $store_job $run_id'"
}
kill_run() {
    local suffix pid
    trap '' INT TERM  # finish the clean-up even if Ctrl-C is pressed again
    for pid in "$logs_pid" "${submitting[@]}"; do
        if [[ -n "$pid" ]]; then kill "$pid" 2>/dev/null || true; fi
    done
    for suffix in "${started[@]}"; do
        log "killing $job $suffix"
        "$flow" kill "$job" "$suffix" >/dev/null 2>&1 || log "could not kill $job $suffix: run '$flow kill $job $suffix'"
    done
    (( ! store_started )) || kill_store  # last: the nodes' agents leave the rendezvous while they stop
}
fail() { log "$*"; log "stopping every job of run '$run_id'"; kill_run; exit 1; }
interrupted() {
    log "interrupted: killing every job of run '$run_id' (a second Ctrl-C changes nothing)"
    kill_run
    # The platform deletes each job's pod: SIGTERM to its main process, worker.sh, which passes it on
    # to the workers (a checkpoint of the step reached, exit 75), and SIGKILL after the grace period.
    log "each job got SIGTERM: its workers checkpoint the step they reach and stop; run again with" \
        "--run-id $run_id to resume ('$flow logs $job $(suffix_of 0)' shows node 0's last lines)"
    exit 130
}
trap interrupted INT TERM

# job_status SUFFIX [JOB]: prints "STATUS HOSTNAME JOB-ID HOW" from `<flow> status` (the platform's job table,
# apolo_cli.formatters.jobs.JobStatusFormatter: rows Job, Status with the reason in parentheses, Exit code,
# Internal Hostname); STATUS is "unknown" when the job cannot be found or the output cannot be read, HOW is
# "-" and how it ended as far as the platform says ("-: exit code 137 (OOMKilled)"), or "-" alone.
# JOB: distributed_training unless given.
job_status() {
    local out state host id code reason how=""
    out="$("$flow" status "${2:-$job}" "$1" 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g')" || true
    state="$(awk '$1 == "Status" { print $2; exit }' <<<"$out")"
    host="$(awk '$1 == "Internal" && $2 == "Hostname" && NF == 3 { print $3; exit }' <<<"$out")"
    id="$(awk '$1 == "Job" && NF == 2 { print $2; exit }' <<<"$out")"
    reason="$(sed -n -e 's/^ *Status  *[a-z]* *(\(.*\)) *$/\1/p' <<<"$out" | head -n 1)"
    code="$(awk '$1 == "Exit" && $2 == "code" && NF == 3 { print $3; exit }' <<<"$out")"
    [[ -z "$code" ]] || how="exit code $code"
    [[ -z "$reason" ]] || how="${how:+$how }($reason)"
    echo "${state:-unknown} ${host:--} ${id:--} -${how:+: $how}"  # HOW starts with '-' so that it is never empty
}

# `<flow> run` returns only once its job has started (apolo run waits while the job is pending), so
# each one runs in the background: the master is watched against --timeout, the workers start together.
start_node() {  # start_node NODE_RANK MASTER_ADDR: submits in the background; the pid is in $!
    local cmd
    mapfile -t cmd < <(run_command "$1" "$2")
    [[ " ${started[*]} " == *" $(suffix_of "$1") "* ]] || started+=("$(suffix_of "$1")")
    "${cmd[@]}" >&2 &
    submitting+=("$!")
}
not_scheduled() {  # not_scheduled WHAT [PRESET]
    fail "$1 was not started within ${timeout_s} s; is preset '${2:-$preset}' available ('apolo config show')?" \
         "Raise --timeout to wait longer for a node."
}

# `<flow> run` ends with the exit status of `apolo run` (apolo_flow.utils.run_subproc), which returns at its first
# look at the job after it left pending (apolo_cli.job.run_job): for a job that has already ended, with the job's
# own exit code, or with EX_PLATFORMERROR (apolo_cli.const) for one that failed without one: the platform never
# started it. A job can start and fail before its `run` returns: that is a node lost, not a preset unavailable.
EX_PLATFORMERROR=125

# wait_running WHAT JOB SUFFIX PID PRESET: until the job runs and has an internal hostname (then in $running_host);
# WHAT names it in the failure lines, PID is its `<flow> run`. The platform fails a job still pending after its
# schedule_timeout (= --timeout); the launcher's own deadline, a little later, covers a CLI that hangs.
running_host=""
wait_running() {
    local what="$1" job_id="$2" suffix="$3" pid="$4" job_preset="$5" state host code="" deadline=$(( SECONDS + timeout_s + 60 ))
    while :; do
        # Its `run`'s exit status once it has returned; never waited for while it runs: the deadline covers a CLI
        # that hangs.
        if [[ -z "$code" ]] && ! kill -0 "$pid" 2>/dev/null; then code=0; wait "$pid" || code=$?; fi
        read -r state host _ < <(job_status "$suffix" "$job_id")
        case "$state" in
            running) if [[ "$host" != "-" ]]; then running_host="$host"; break; fi ;;
            succeeded|cancelled)
                fail "$what ended ($state) before the other jobs started; see '$flow logs $job_id $suffix'" ;;
            failed)  # how, its `run` says at its next look at the job
                if [[ -n "$code" ]] && (( code != EX_PLATFORMERROR )); then
                    fail "$what failed before the other jobs started; see '$flow logs $job_id $suffix'"
                elif [[ -n "$code" ]] || (( SECONDS >= deadline )); then
                    not_scheduled "$what ($job_id $suffix)" "$job_preset"
                fi ;;
        esac
        (( ${code:-0} == 0 )) || fail "could not start $what: '$flow run $job_id --suffix $suffix ...' failed (see above)"
        (( SECONDS < deadline )) || not_scheduled "$what (last status: $state)" "$job_preset"
        sleep "$poll_s"
    done
    [[ -n "$code" ]] || wait "$pid" 2>/dev/null || true
    submitting=()
}

log "run '$run_id': $nodes node(s), preset $preset, via $flow; results in results/$run_id on storage"
first_worker=1  # nodes first_worker..N-1 start together, pointed at master_host
if (( external_store )); then
    # The store first, on a CPU node of its own: every node's agent is its client, node 0's too.
    mapfile -t cmd < <(store_command)
    store_started=1
    "${cmd[@]}" >&2 &
    submitting+=("$!")
    wait_running "the rendezvous store's job" "$store_job" "$run_id" "$!" "$store_preset"
    master_host="$running_host"
    log "rendezvous store $store_job $run_id is running at $master_host (--external-store)"
    first_worker=0
else
    start_node 0 ""
    # Wait for the master to run and to have an internal hostname; the others connect to it.
    wait_running "the master job" "$job" "$(suffix_of 0)" "$!" "$preset"
    master_host="$running_host"
    log "master $job $(suffix_of 0) is running at $master_host"
fi
workers=()
for (( rank = first_worker; rank < nodes; rank++ )); do
    start_node "$rank" "$master_host"
    workers+=("$!")
done
ended_early=0  # nodes whose job started and ended before its `run` returned
for (( rank = first_worker; rank < nodes; rank++ )); do
    code=0
    wait "${workers[rank - first_worker]}" || code=$?
    (( code )) || continue
    read -r state _ < <(job_status "$(suffix_of "$rank")")
    case "$state" in
        failed) (( code != EX_PLATFORMERROR )) || not_scheduled "node $rank ($job $(suffix_of "$rank"))" ;;&
        failed|cancelled|succeeded)  # it ran and has ended already: the watch below reports it or submits it again
            log "node $rank ($job $(suffix_of "$rank")) started and has already ended ($state)"
            ended_early=$(( ended_early + 1 )) ;;
        *) fail "could not start node $rank ($job $(suffix_of "$rank")), status $state (see above)" ;;
    esac
done
submitting=()
if (( ended_early )); then log "all $nodes nodes were started"; elif (( nodes > 1 )); then log "all $nodes nodes are running"; fi

"$flow" logs "$job" "$(suffix_of 0)" &
logs_pid=$!

# Watch every job: one failed or cancelled job ends the run (with --min-nodes: once fewer than MIN are left;
# before that, nodes 1..N-1 are submitted again, up to --max-resubmits times each, node 0 too with
# --external-store); all succeeded is success (with --min-nodes: all that are left). The store's job ending
# ends the run at once: every node's rendezvous is gone with it.
unknown_streak=0
lost=()  # nodes ended while at least --min-nodes others went on, and not submitted again
declare -A resubmits=() replaced=() resubmit_pid=()  # per node: how many times, the ended job's id, the `run` pid
while :; do
    sleep "$poll_s"
    succeeded=0 unknown=0 ended=() ended_ranks=() ended_ids=() ended_how=()
    if (( external_store )); then  # first: the nodes' own failures follow from its loss
        read -r state _ id how < <(job_status "$run_id" "$store_job")
        case "$state" in
            failed|cancelled|succeeded)
                fail "the rendezvous store's job ($store_job $run_id, job $id) ended: $state${how#-}; every node's" \
                     "rendezvous is gone with it; its logs: '$flow logs $store_job $run_id'. Run again with" \
                     "--run-id $run_id to resume from the newest checkpoint" ;;
            unknown) unknown=$(( unknown + 1 )) ;;
        esac
    fi
    for (( rank = 0; rank < nodes; rank++ )); do
        [[ " ${lost[*]} " != *" $rank "* ]] || continue
        read -r state _ id how < <(job_status "$(suffix_of "$rank")")
        # The job that ended is still the node's until the platform has its new one: not an end again.
        if [[ -n "${replaced[$rank]:-}" && "$id" == "${replaced[$rank]}" ]] && kill -0 "${resubmit_pid[$rank]}" 2>/dev/null; then
            continue
        fi
        case "$state" in
            succeeded) succeeded=$(( succeeded + 1 )) ;;
            failed|cancelled) ended_ranks+=("$rank"); ended_ids+=("$id"); ended_how+=("$state${how#-}")
                              ended+=("node $rank ($job $(suffix_of "$rank")) $state; its logs: '$flow logs $job $(suffix_of "$rank")'") ;;
            unknown) unknown=$(( unknown + 1 )) ;;
        esac
    done
    # Every node that ended in this poll, not just the lowest rank: when one node dies, the others
    # follow within seconds (a graceful stop, exit 75), and the first of them is rarely the cause.
    if (( ${#ended[@]} && min_nodes < nodes && nodes - ${#lost[@]} - ${#ended[@]} >= min_nodes )); then
        for i in "${!ended_ranks[@]}"; do
            rank="${ended_ranks[i]}"
            id="${ended_ids[i]}" count="${resubmits[$rank]:-0}"
            what="node $rank (job $id, $job $(suffix_of "$rank")) ${ended_how[i]}"
            if (( rank == 0 && ! external_store )); then
                log "${ended[i]}; the others go on (--min-nodes $min_nodes); node 0 hosts the rendezvous store: not submitted again"
                lost+=("$rank")
            elif (( succeeded > 0 )); then  # the training has ended on a node: a new job would find no run
                log "$what; the run has finished on another node: not submitted again"
                lost+=("$rank")
            elif (( count < max_resubmits )); then
                count=$(( count + 1 ))
                resubmits[$rank]=$count replaced[$rank]="$id"
                log "$what; resubmitting it ($count of $max_resubmits); the others go on (--min-nodes $min_nodes)"
                start_node "$rank" "$master_host"
                resubmit_pid[$rank]=$!
            else
                log "$what; submitted again $max_resubmits time(s) (--max-resubmits): the others go on without it (--min-nodes $min_nodes); its logs: '$flow logs $job $(suffix_of "$rank")'"
                lost+=("$rank")
            fi
        done
    elif (( ${#ended[@]} )); then
        for line in "${ended[@]:0:${#ended[@]}-1}"; do log "$line"; done
        fail "${ended[-1]}"
    fi
    if (( succeeded > 0 && succeeded + ${#lost[@]} == nodes )); then break; fi
    # A status that cannot be read once is a network hiccup; for many checks in a row, the job is gone.
    if (( unknown > 0 )); then unknown_streak=$(( unknown_streak + 1 )); else unknown_streak=0; fi
    (( unknown_streak < 20 )) || fail "the status of $unknown job(s) could not be read 20 times in a row"
done
wait "$logs_pid" 2>/dev/null || true
if (( store_started )); then  # the nodes have ended: the store has nothing left to serve
    trap '' INT TERM
    kill_store
fi
trap - INT TERM
log "run '$run_id' finished on all $nodes nodes; checkpoints in results/$run_id/checkpoints on storage" \
    "('$flow download results' fetches them)"
