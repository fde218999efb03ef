#!/usr/bin/env bash
# One command, N-node DDP training on the Apolo platform: one `distributed_training` job of .neuro/live.yml per
# node, started, watched and killed together through the flow CLI (neuro-flow or apolo-flow).
#
#   scripts/run_distributed_on_platform.sh --nodes 2                  # DummyDataset, tiny model
#   scripts/run_distributed_on_platform.sh --nodes 4 --min-nodes 3 --external-store -- --preset bert-base
#   scripts/run_distributed_on_platform.sh --help                     # options, environment, exit statuses
#
# This script is glue: it finds a Python and runs the launcher, python -m distqa.launch.platform
# (src/distqa/launch/platform/), with the same arguments. The launcher runs on your machine: the repository's
# .venv (`make setup`, which also installs the flow CLI), else python3 with python-dotenv; $PYTHON picks another.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"  # also refuses an ENV_FILE that names no file
find_python "$repo_root"
if ! "$PYTHON" -c "import dotenv" 2>/dev/null; then
    echo "run_distributed_on_platform.sh: $PYTHON cannot import dotenv (python-dotenv): run 'make setup' (the" \
         "repository's .venv), or 'pip install python-dotenv', or name another Python in PYTHON" >&2
    exit 2
fi
# The package from this checkout, installed or not; exec: Ctrl-C and SIGTERM reach the launcher itself.
export PYTHONPATH="$repo_root/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m distqa.launch.platform "$@"
