#!/usr/bin/env bash
# The learnable synthetic NQ task end to end on this machine: generate the data, train the tiny model
# on 2 emulated nodes (evaluating on both), predict the test file and score it with the Kaggle metric.
# About 4 minutes on 2 CPU cores; the expected numbers of docs/EVALUATION.md come from this
# script.
#
# Usage:
#   scripts/train_synthetic_nq.sh [--data-dir DIR] [--run-id ID] [--output-dir DIR] [--nq-cache-dir DIR]
#                                 [--] [TRAINER ARGS...]
#   make synthetic-nq                     # the same, with the defaults
#
# Writes DIR (default data/nq-synthetic): simplified-nq-train.jsonl (10000 examples, seed 0),
# simplified-nq-test.jsonl (500, seed 1, no annotations) and simplified-nq-test-gold.jsonl (its gold);
# then <output-dir>/<ID>/ (default results/synthetic-nq/) with checkpoints/best.pt, submission.csv and
# score.json. The task and the difficulty settings are described in src/distqa/qa/nq/synthetic.py;
# the training settings are configs/tiny-synthetic-nq.toml. Trainer args override the preset.
# Environment: PYTHON (default: .venv/bin/python if present, else python3).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
export PYTHON
data_dir="$repo_root/data/nq-synthetic"
run_id="synthetic-nq"
output_dir="results"
cache_dir=""
parse_synthetic_run_args --nq-cache-dir "$@"

# The generator's difficulty: documents of 100-400 tokens, fewer distractors than its defaults, and
# half of the questions with a short answer. Each file is a pure function of these arguments.
answer_mix="unknown=0.3,short=0.5,long=0.1,yes=0.05,no=0.05"
generate=(--min-doc-tokens 100 --max-doc-tokens 400 --distractor-rate 0.1 --same-entity-rate 0.1
          --hard-negative-rate 0.2 --answer-mix "$answer_mix")
mkdir -p "$data_dir"
"$PYTHON" -m distqa.qa.nq.synthetic --output "$data_dir/simplified-nq-train.jsonl" --examples 10000 --seed 0 "${generate[@]}"
"$PYTHON" -m distqa.qa.nq.synthetic --output "$data_dir/simplified-nq-test.jsonl" --examples 500 --seed 1 --test "${generate[@]}"
"$PYTHON" -m distqa.qa.nq.synthetic --output "$data_dir/simplified-nq-test-gold.jsonl" --examples 500 --seed 1 "${generate[@]}"

locations=(--output-dir "$output_dir")
[[ -n "$cache_dir" ]] && locations+=(--nq-cache-dir "$cache_dir")
"$repo_root/scripts/run_distributed_locally.sh" --run-id "$run_id" -- --preset tiny-synthetic-nq \
    --nq-train-file "$data_dir/simplified-nq-train.jsonl" "${locations[@]}" "${trainer_args[@]}"

run_dir="$output_dir/$run_id"
predict_cache=()
[[ -n "$cache_dir" ]] && predict_cache=(--nq-cache-dir "$cache_dir")
"$PYTHON" -m distqa.predict --checkpoint "$run_dir/checkpoints/best.pt" \
    --input "$data_dir/simplified-nq-test.jsonl" --output "$run_dir/submission.csv" "${predict_cache[@]}"
"$PYTHON" -m distqa.score --gold "$data_dir/simplified-nq-test-gold.jsonl" --submission "$run_dir/submission.csv" \
    | tee "$run_dir/score.json"
