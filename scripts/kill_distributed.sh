#!/usr/bin/env bash
# Kill the jobs of a distributed run started by run_distributed_on_platform.sh (for example after
# the launcher itself was killed, or from another terminal), or every job of this project's flow.
#
# Usage:
#   scripts/kill_distributed.sh --run-id ID [--nodes N]   # jobs distributed_training ID-0 .. ID-(N-1),
#                                                         # then rendezvous_store ID (--external-store)
#   scripts/kill_distributed.sh --all                     # every running job of .neuro/live.yml
#
# --nodes defaults to $NODES, else NODES= in .env, else 2; killing a node that is not running is
# harmless, so a larger N is fine. FLOW_CLI picks apolo-flow or neuro-flow (default: whichever is
# installed, apolo-flow first). `neuro-flow ps` lists what is still running.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "kill_distributed.sh: $*" >&2; exit 2; }

run_id="" all=0
nodes="$(setting NODES 2)"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --run-id) [[ $# -ge 2 && -n "$2" ]] || die "--run-id needs a value"; run_id="$2"; shift 2 ;;
        --nodes) [[ $# -ge 2 && -n "$2" ]] || die "--nodes needs a value"; nodes="$2"; shift 2 ;;
        --all) all=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[[ "$nodes" =~ ^[0-9]+$ ]] || die "--nodes must be a whole number, got '$nodes'"
(( all )) || [[ -n "$run_id" ]] || die "name the run with --run-id ID (the launcher printed it), or pass --all"
flow="$(find_flow_cli)" || exit 2
cd "$repo_root"  # the flow CLI finds .neuro/live.yml from its working directory up

if (( all )); then
    exec "$flow" kill ALL
fi
status=0
for (( rank = 0; rank < nodes; rank++ )); do
    "$flow" kill distributed_training "$run_id-$rank" || status=$?
done
# The store last, as the launcher does: a node still running would lose its rendezvous first.
"$flow" kill rendezvous_store "$run_id" || status=$?
exit "$status"
