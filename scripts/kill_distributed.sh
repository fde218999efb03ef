#!/usr/bin/env bash
# Kill the jobs of a distributed run started by run_distributed_on_platform.sh (for example after the launcher itself
# was killed, or from another terminal), or every job of this project's flow.
#
#   scripts/kill_distributed.sh --run-id ID [--nodes N]   # every node's job of the run, then its store's
#   scripts/kill_distributed.sh --all                     # every running job of .neuro/live.yml
#   scripts/kill_distributed.sh --help                    # the defaults, the environment, exit statuses
#
# This script is glue, as run_distributed_on_platform.sh is: it runs python -m distqa.launch.platform.kill
# (src/distqa/launch/platform/kill.py), which kills the jobs the launcher's way, in its order.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"  # also refuses an ENV_FILE that names no file
platform_python kill_distributed.sh "$repo_root"
exec "$PYTHON" -m distqa.launch.platform.kill "$@"
