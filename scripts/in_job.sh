#!/usr/bin/env bash
# Runs one command of a platform job (prepare, predict) after the check worker.sh makes for training:
# the run directories (DISTQA_OUTPUT_DIR) and the hub cache (HF_HOME) must be writable, or the job
# stops at once naming the folder and the fix.
#
# Usage: scripts/in_job.sh COMMAND [ARGS...]     e.g. scripts/in_job.sh python -m distqa.prepare ...
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/common.sh
source "$script_dir/common.sh"
[[ $# -gt 0 ]] || { echo "in_job.sh: name the command to run (see the header of this file)" >&2; exit 2; }
require_writable in_job.sh "${DISTQA_OUTPUT_DIR:-}" "${HF_HOME:-}"
exec "$@"
