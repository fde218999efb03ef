#!/usr/bin/env bash
# Regenerate the committed synthetic Natural Questions sample (byte-identical on every machine).
#
# Usage:
#   scripts/make_nq_sample.sh [DIR]        # default DIR: data/nq-sample (what `make nq-sample` runs)
#
# Writes DIR/simplified-nq-train.jsonl (200 examples, seed 0, documents of 80-500 whitespace tokens,
# two long ones of 1250-2500), DIR/simplified-nq-test.jsonl (40 examples, seed 1, test form: no
# annotations) and DIR/simplified-nq-test-gold.jsonl (the same 40 examples with their annotations: the
# gold for `python -m distqa.score`). tests/qa/test_synthetic_nq.py checks that this reproduces the
# committed files.
# Environment: PYTHON (interpreter with distqa installed; default: .venv/bin/python if present, else python3).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
case "${1:-}" in
    -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
esac
dir="${1:-$repo_root/data/nq-sample}"

"$PYTHON" -m distqa.qa.nq.synthetic --output "$dir/simplified-nq-train.jsonl" --examples 200 --seed 0 \
    --min-doc-tokens 80 --max-doc-tokens 500 --long-docs 2 --long-doc-tokens 2500
"$PYTHON" -m distqa.qa.nq.synthetic --output "$dir/simplified-nq-test.jsonl" --examples 40 --seed 1 --test \
    --min-doc-tokens 80 --max-doc-tokens 500
"$PYTHON" -m distqa.qa.nq.synthetic --output "$dir/simplified-nq-test-gold.jsonl" --examples 40 --seed 1 \
    --min-doc-tokens 80 --max-doc-tokens 500
