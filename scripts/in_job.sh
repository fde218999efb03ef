#!/usr/bin/env bash
# Runs one command of a platform job (prepare, predict) after the check worker.sh makes for training:
# the run directories (DISTQA_OUTPUT_DIR) and the hub cache (HF_HOME) must be writable, or the job
# stops at once naming the folder and the fix.
# With --project-args, the module's flags start with project.toml's [jobs] args (the project's task and preset,
# as every job in deploy/ gets them from worker.sh --project-args), before the job's own.
#
# Usage: scripts/in_job.sh [--project-args] COMMAND [ARGS...]   e.g. scripts/in_job.sh python -m distqa.predict ...
#        scripts/in_job.sh --project-args python -m MODULE [ARGS...]
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/common.sh
source "$script_dir/common.sh"
if [[ ${1:-} == --project-args ]]; then
    shift
    [[ $# -ge 3 && $2 == -m ]] || { echo "in_job.sh: --project-args comes before python -m MODULE" >&2; exit 2; }
    words="$(python3 "$script_dir/../src/distqa/upkeep/project.py" --split jobs.args)" || exit 2
    project=()
    [[ -z $words ]] || mapfile -t project <<<"$words"
    set -- "$1" "$2" "$3" "${project[@]}" "${@:4}"
fi
[[ $# -gt 0 ]] || { echo "in_job.sh: name the command to run (see the header of this file)" >&2; exit 2; }
require_writable in_job.sh "${DISTQA_OUTPUT_DIR:-}" "${HF_HOME:-}"
exec "$@"
