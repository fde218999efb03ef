#!/usr/bin/env bash
# The learnable synthetic SQuAD task end to end on this machine: generate SQuAD v2.0 files, train the tiny model
# on 2 emulated nodes (evaluating on both ranks), predict an unseen test file and score it with the official
# SQuAD metric. The expected numbers of docs/SQUAD.md come from this script; tests/qa/test_squad_training.py runs it.
#
# Usage:
#   scripts/train_synthetic_squad.sh [--data-dir DIR] [--run-id ID] [--output-dir DIR] [--squad-cache-dir DIR]
#                                    [--] [TRAINER ARGS...]
#
# Writes DIR (default data/squad-synthetic): train.json (seed 0), dev.json (seed 1, the validation data that
# picks best.pt and tunes the no-answer threshold) and test.json (seed 2, for predict and score), each a third
# unanswerable; then <output-dir>/<ID>/ (default results/squad-synthetic/) with checkpoints/best.pt,
# predictions.json and score.json. The task is described in src/distqa/qa/squad/synthetic.py, the training
# settings are configs/tiny-synthetic-squad.toml; trainer args override the preset.
# Environment: PYTHON (default: .venv/bin/python if present, else python3).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
export PYTHON
data_dir="$repo_root/data/squad-synthetic"
run_id="squad-synthetic"
output_dir="results"
cache_dir=""
parse_synthetic_run_args --squad-cache-dir "$@"

# The generator's difficulty: one fact per paragraph after a filler sentence of at most 10 words (contexts that fit
# windows of 48 tokens); the unanswerable questions ask about an entity the article never names.
mkdir -p "$data_dir"
for split in train:0:1000 dev:1:100 test:2:100; do
    IFS=: read -r name seed articles <<< "$split"
    "$PYTHON" -m distqa.qa.squad.synthetic --output "$data_dir/$name.json" --articles "$articles" --seed "$seed" \
        --facts 1 --plausible 0 --filler-words 10
done

cache=()
[[ -n "$cache_dir" ]] && cache=(--squad-cache-dir "$cache_dir")
"$repo_root/scripts/run_distributed_locally.sh" --run-id "$run_id" -- --preset tiny-synthetic-squad \
    --squad-train-file "$data_dir/train.json" --squad-validation-file "$data_dir/dev.json" \
    --output-dir "$output_dir" "${cache[@]}" "${trainer_args[@]}"

run_dir="$output_dir/$run_id"
"$PYTHON" -m distqa.predict --checkpoint "$run_dir/checkpoints/best.pt" --input "$data_dir/test.json" \
    --output "$run_dir/predictions.json" "${cache[@]}"
"$PYTHON" -m distqa.score --format squad --gold "$data_dir/test.json" --predictions "$run_dir/predictions.json" \
    | tee "$run_dir/score.json"
