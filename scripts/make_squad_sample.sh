#!/usr/bin/env bash
# Regenerate the committed synthetic SQuAD sample (byte-identical on every machine).
#
# Usage:
#   scripts/make_squad_sample.sh [DIR]        # default DIR: data/squad-sample
#
# Writes DIR/train.json (40 articles, seed 0) and DIR/dev.json (12 articles, seed 1): SQuAD v2.0 files of the
# synthetic task described in src/distqa/qa/squad/synthetic.py, a third of the questions unanswerable.
# tests/qa/test_synthetic_squad.py checks that this reproduces the committed files.
# Environment: PYTHON (interpreter with distqa installed; default: .venv/bin/python if present, else python3).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
case "${1:-}" in
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
esac
dir="${1:-$repo_root/data/squad-sample}"

"$PYTHON" -m distqa.qa.squad.synthetic --output "$dir/train.json" --articles 40 --seed 0
"$PYTHON" -m distqa.qa.squad.synthetic --output "$dir/dev.json" --articles 12 --seed 1
