#!/usr/bin/env bash
# Download the real Natural Questions data of the Kaggle competition "TensorFlow 2.0 Question Answering"
# (tensorflow2-question-answering) with the Kaggle CLI, unzip it and check the files.
#
# Usage:
#   scripts/download_nq.sh [--dir DIR] [--env-file FILE] [--keep-zip]
#
#   --dir DIR        where the files go (default: data/nq, ignored by git)
#   --env-file FILE  read KAGGLE_USERNAME / KAGGLE_KEY from FILE (default: $ENV_FILE, else .env in the
#                    working directory, as every script and entry point)
#   --keep-zip       keep the downloaded zip (a few GB) after unzipping
#
# Before the first download:
#   1. pip install kaggle                (the CLI; not in requirements.txt, this is a one-time step)
#   2. credentials: an API token from https://www.kaggle.com/settings ("Create New Token"), either as
#      KAGGLE_USERNAME=... and KAGGLE_KEY=... in .env or the environment, or as ~/.kaggle/kaggle.json
#      (or $KAGGLE_CONFIG_DIR/kaggle.json), chmod 600
#   3. accept the competition rules, with the same account, at
#      https://www.kaggle.com/competitions/tensorflow2-question-answering/rules
# Disk: a few GB for the zip plus about 17 GB unzipped (simplified-nq-train.jsonl is about 16 GB).
# Result: DIR/simplified-nq-train.jsonl, DIR/simplified-nq-test.jsonl, DIR/sample_submission.csv.
# Environment variables win over the env file. Exit status: 0 on success, 2 for usage errors, 1 otherwise.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
competition=tensorflow2-question-answering
rules_url="https://www.kaggle.com/competitions/$competition/rules"
dir="$repo_root/data/nq"
keep_zip=0
required_files=(simplified-nq-train.jsonl simplified-nq-test.jsonl)
needed_gb=22

die() { echo "download_nq.sh: $*" >&2; exit 1; }
usage_error() { echo "download_nq.sh: $* (see --help)" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) [[ $# -ge 2 && -n "$2" ]] || usage_error "--dir needs a value"; dir="$2"; shift 2 ;;
        --env-file) [[ $# -ge 2 && -n "$2" ]] || usage_error "--env-file needs a value"; env_file="$2"; shift 2 ;;
        --keep-zip) keep_zip=1; shift ;;
        -h|--help) usage "${BASH_SOURCE[0]}"; exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done

command -v kaggle >/dev/null 2>&1 \
    || die "the Kaggle CLI is not installed (or not on PATH): run 'pip install kaggle' (in this .venv: .venv/bin/pip install kaggle) and try again"

# KAGGLE_USERNAME / KAGGLE_KEY from the env file, unless already in the environment. The file is read,
# not sourced (scripts/common.sh: dotenv_value): only these two settings are taken.
if [[ -f "$env_file" ]]; then
    [[ -n "${KAGGLE_USERNAME:-}" ]] || KAGGLE_USERNAME="$(dotenv_value KAGGLE_USERNAME "$env_file")"
    [[ -n "${KAGGLE_KEY:-}" ]] || KAGGLE_KEY="$(dotenv_value KAGGLE_KEY "$env_file")"
fi
if [[ -n "${KAGGLE_USERNAME:-}" && -n "${KAGGLE_KEY:-}" ]]; then
    export KAGGLE_USERNAME KAGGLE_KEY
    credentials="KAGGLE_USERNAME/KAGGLE_KEY ($KAGGLE_USERNAME)"
else
    unset KAGGLE_USERNAME KAGGLE_KEY
    kaggle_json="${KAGGLE_CONFIG_DIR:-$HOME/.kaggle}/kaggle.json"
    [[ -f "$kaggle_json" ]] || die "no Kaggle credentials: set KAGGLE_USERNAME and KAGGLE_KEY in $env_file or the environment, or put the API token from https://www.kaggle.com/settings in $kaggle_json (chmod 600)"
    credentials="$kaggle_json"
fi

mkdir -p "$dir"
available_kb="$(df -Pk "$dir" | awk 'NR == 2 {print $4}')"
if [[ "$available_kb" =~ ^[0-9]+$ ]] && (( available_kb < needed_gb * 1024 * 1024 )); then
    echo "download_nq.sh: warning: $dir has $(( available_kb / 1024 / 1024 )) GB free; the zip and its contents need about $needed_gb GB" >&2
fi

echo "Downloading $competition into $dir with the Kaggle CLI (credentials: $credentials) ..."
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
kaggle competitions download -c "$competition" -p "$dir" 2>&1 | tee "$log" || status=$?
zip="$dir/$competition.zip"
# Some versions of the CLI print an HTTP error and still exit 0: judge by the missing zip too.
if (( status != 0 )) || [[ ! -f "$zip" ]]; then
    if grep -qiE '\b403\b|forbidden' "$log"; then
        die "Kaggle refused the download (403 Forbidden): accept the competition rules with this account at $rules_url, then run this again"
    elif grep -qiE '\b401\b|unauthori[sz]ed' "$log"; then
        die "Kaggle rejected the credentials (401 Unauthorized) from $credentials: create a new API token at https://www.kaggle.com/settings"
    elif (( status != 0 )); then
        die "the Kaggle CLI failed with status $status (its output is above)"
    fi
fi

if [[ -f "$zip" ]]; then
    echo "Unzipping $zip (about 17 GB) ..."
    if command -v unzip >/dev/null 2>&1; then
        unzip -o -q "$zip" -d "$dir"
    else
        python3 -m zipfile -e "$zip" "$dir"
    fi
    (( keep_zip )) || rm -f "$zip"
fi

missing=()
for name in "${required_files[@]}"; do
    [[ -s "$dir/$name" && "$(head -c 1 "$dir/$name")" == "{" ]] || missing+=("$name")
done
(( ${#missing[@]} == 0 )) || die "expected files missing or not jsonl in $dir: ${missing[*]}"

echo "Done: $dir holds"
for name in "${required_files[@]}" sample_submission.csv; do
    [[ -e "$dir/$name" ]] && echo "  $name ($(du -h "$dir/$name" | cut -f1))"
done
exit 0
