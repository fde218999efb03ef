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
platform_python run_distributed_on_platform.sh "$repo_root"
# exec: Ctrl-C and SIGTERM reach the launcher itself.
exec "$PYTHON" -m distqa.launch.platform "$@"
