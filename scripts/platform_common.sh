# Shared by run_distributed_on_platform.sh and kill_distributed.sh (sourced, not run).
# shellcheck shell=bash

# The flow CLI: $FLOW_CLI if set, else apolo-flow (the current name), else neuro-flow (the old
# name). Both read .neuro/live.yml and accept the same subcommands.
find_flow_cli() {
    if [[ -n "${FLOW_CLI:-}" ]]; then
        command -v "$FLOW_CLI" >/dev/null || { echo "FLOW_CLI=$FLOW_CLI is not on PATH" >&2; return 1; }
        echo "$FLOW_CLI"
    elif command -v apolo-flow >/dev/null; then
        echo apolo-flow
    elif command -v neuro-flow >/dev/null; then
        echo neuro-flow
    else
        echo "neither apolo-flow nor neuro-flow is on PATH: 'make setup' installs it into .venv" \
             "(then 'source .venv/bin/activate'), or 'pip install neuro-flow'; log in with 'apolo login'" >&2
        return 1
    fi
}

# dotenv_value KEY FILE: the value of KEY=... in a .env file, without sourcing it (quotes removed).
dotenv_value() {
    local key="$1" file="$2" line value
    [[ -f "$file" ]] || return 0
    line=$(grep -E "^[[:space:]]*(export[[:space:]]+)?${key}=" "$file" | tail -n 1 || true)
    [[ -n "$line" ]] || return 0
    value="${line#*=}"
    value="${value%%#*}"
    value="${value%"${value##*[![:space:]]}"}"
    value="${value#\"}"; value="${value%\"}"; value="${value#\'}"; value="${value%\'}"
    echo "$value"
}

# setting NAME DEFAULT: $NAME from the environment, else from the .env file (the repository's, or
# $ENV_FILE), else DEFAULT.
setting() {
    local name="$1" default="$2" value
    value="${!name:-}"
    [[ -n "$value" ]] || value="$(dotenv_value "$name" "${ENV_FILE:-${repo_root:?}/.env}")"
    echo "${value:-$default}"
}
