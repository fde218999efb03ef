#!/usr/bin/env bash
# A hyperparameter sweep whose trials are ordinary runs through the launchers (python -m distqa.sweep, with the
# repository's Python; docs/SWEEPS.md). Run it where the sweep directory is on storage every trial's node sees
# (this machine for --launcher local, a login node for slurm, a CPU job with the results volume for platform),
# never on a training node.
#
# Usage:
#   scripts/sweep.sh SWEEP [--sweep-dir DIR] [--launcher local|platform|slurm] [--nodes N] [--procs-per-node M]
#                    [--parallel K] [--launcher-args "..."] [--trial-sweep-dir DIR] [-- TRAINER FLAGS...]
#   scripts/sweep.sh --show DIR
#
#   scripts/sweep.sh demo -- --squad-train-file data/squad-synthetic/train.json \
#       --squad-validation-file data/squad-synthetic/dev.json      # 6 trials on 2 emulated nodes each
#   scripts/sweep.sh bert-base-nq --launcher platform --nodes 1 --procs-per-node 8 --parallel 3 \
#       --launcher-args "--preset gpu-large" -- --nq-train-file /data/simplified-nq-train.jsonl
#   scripts/sweep.sh bert-base-squad --launcher slurm --nodes 1 --procs-per-node 8 --parallel 2 \
#       --launcher-args "--gpus-per-node 8" -- --squad-train-file ... --squad-validation-file ...
#   scripts/sweep.sh --show results/sweeps/demo                   # the table, running or done
#
# SWEEP is configs/sweeps/SWEEP.toml, or a path to a .toml. Ctrl-C (or SIGTERM) stops the running trials with a
# checkpoint each and exits 75; the same command again resumes them. Environment: PYTHON (default: .venv/bin/python
# if present, else python3); ENV_FILE as for every entry point.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
export PYTHON  # the trials' launchers use the same interpreter
case "${1:-}" in
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
esac
# exec: a terminal's Ctrl-C and a SIGTERM reach the sweep itself, which stops its trials gracefully.
exec "$PYTHON" -m distqa.sweep "$@"
