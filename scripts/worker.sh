#!/usr/bin/env bash
# The in-job entry point: one torchrun agent for this node, joining the run's c10d rendezvous. Every node of a run
# executes it (a platform job per node, a container, a Slurm task, a Kubernetes pod); the node with --node-rank 0 is
# the master and hosts the rendezvous store on --master-port.
#
#   scripts/worker.sh [--nnodes N] [--node-rank I] [--master-addr HOST] ... [--] [TRAINER ARGS...]
#   scripts/worker.sh --help      # every option, the exit statuses and the environment it reads
#
#   scripts/worker.sh --nnodes 1 -- --preset bert-base                    # one node, all its GPUs
#   scripts/worker.sh --nnodes 2 --node-rank 0 --run-id r1                # the master
#   scripts/worker.sh --nnodes 2 --node-rank 1 --master-addr job-1234.platform-jobs --run-id r1
#
# This script finds the interpreter, checks the output folders and that the interpreter imports distqa (a start that
# imports nothing else), and execs
# `python -m distqa.launch.node` with its arguments, which does the rest in one process, torchrun's agent included
# (src/distqa/launch/: node.py; the options and the --help text: node_options.py; Kubeflow's and SkyPilot's
# variables: engines.py). So the process the engine started is the node's Python, and
# SIGTERM/SIGINT to it reach torchrun's agent as SIGTERM. Exit status: 0 when the run finished; 75 when the workers
# stopped on a signal after a checkpoint of the step reached; 3 when node 0's rendezvous could not be reached; 4 when
# it did not fill up; 2 for a wrong option; the workers' own when they refused to run; torchrun's otherwise.
#
# Environment: PYTHON, the interpreter with distqa installed (default: the repository's .venv/bin/python if there is
# one, else python3, else python); the rest: --help.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
# The run directories (DISTQA_OUTPUT_DIR; the platform's results volume) and the hub cache (HF_HOME) must take files
# whoever owns their mounts: say so now (exit 2), not as a traceback on some rank later.
require_writable worker.sh "${DISTQA_OUTPUT_DIR:-}" "${HF_HOME:-}"
"$PYTHON" -c "import distqa" 2>/dev/null || {
    echo "worker.sh: $PYTHON cannot import distqa; run inside the image, or 'make setup' and PYTHON=.venv/bin/python" >&2
    exit 2
}
# This checkout's project.toml and packages, even where distqa is installed from another (distqa.launch.node).
export WORKER_CHECKOUT="$repo_root"
exec "$PYTHON" -m distqa.launch.node "$@"
