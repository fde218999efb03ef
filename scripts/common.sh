# Helpers shared by the scripts (sourced, not run): the Python to use (the platform launcher's too), settings from
# .env, and the check that a job can write its storage. Each exists here once.
# shellcheck shell=bash

# find_python REPO_ROOT: sets PYTHON unless it is set already: the repository's .venv/bin/python
# (what `make setup` creates), else python3, else python (inside the image: the base's interpreter).
find_python() {
    if [[ -n "${PYTHON:-}" ]]; then return 0; fi
    if [[ -x "$1/.venv/bin/python" ]]; then PYTHON="$1/.venv/bin/python"
    elif command -v python3 >/dev/null; then PYTHON=python3
    else PYTHON=python; fi
}

# usage SCRIPT: what SCRIPT's --help prints, its header comment (line 2 up to `set -euo`) without the '# '.
usage() { sed -n '2,/^set -euo/p' "$1" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# require_writable WHO DIR...: stop (exit 2) unless this process can create files in every DIR
# (created first when missing). The platform mounts storage folders with an owner and mode it
# chooses (`neuro-flow mkvolumes` creates them through the storage service) and `apolo run` cannot
# pick the user, so say which folder fails, whose it is and how to fix it, before anything runs.
require_writable() {
    local who="$1" dir probe owner mode me
    shift
    for dir in "$@"; do
        [[ -n "$dir" ]] || continue
        # A real file, not access(2): network storage (root_squash, ACLs) can answer W_OK falsely.
        if mkdir -p "$dir" 2>/dev/null && probe="$(mktemp -p "$dir" .write-test.XXXXXX 2>/dev/null)"; then
            rm -f "$probe"
            continue
        fi
        me="$(id -u)"
        local existing="$dir"
        while [[ ! -e "$existing" && "$existing" != / ]]; do existing="$(dirname "$existing")"; done
        owner="$(stat -c %u "$existing" 2>/dev/null || echo '?')"
        mode="$(stat -c %a "$existing" 2>/dev/null || echo '?')"
        echo "$who: cannot write to $dir ($existing is owned by uid $owner, mode $mode; this job runs as uid $me)." \
             "Fix: run as root or as uid $owner (the image runs as root; 'docker run --user $owner'), or let" \
             "uid $me write there ('chmod a+rwx $existing' as its owner)." >&2
        exit 2
    done
}

# platform_python SCRIPT REPO_ROOT: what the platform launcher (python -m distqa.launch.platform, and .kill) runs
# with: find_python's interpreter, which must import python-dotenv (the launcher reads .env with it, as the trainer
# does), and this checkout's package on PYTHONPATH, installed or not. The launcher runs on the user's machine.
platform_python() {
    find_python "$2"
    if ! "$PYTHON" -c "import dotenv" 2>/dev/null; then
        echo "$1: $PYTHON cannot import dotenv (python-dotenv): run 'make setup' (the repository's .venv), or" \
             "'pip install python-dotenv', or name another Python in PYTHON" >&2
        exit 2
    fi
    export PYTHONPATH="$2/src${PYTHONPATH:+:$PYTHONPATH}"
}

# dotenv_value KEY FILE: the value of KEY=... in a .env file, read as python-dotenv (the trainer's
# reader) reads it, without sourcing the file: the last such line wins, `export ` and blanks around
# `=` are allowed; a quoted value is taken whole ('#' included), an unquoted one ends at ` #`.
dotenv_value() {
    local key="$1" file="$2" line value
    [[ -f "$file" ]] || return 0
    line=$(grep -E "^[[:space:]]*(export[[:space:]]+)?${key}[[:space:]]*=" "$file" | tail -n 1 || true)
    [[ -n "$line" ]] || return 0
    value="${line#*=}"
    value="${value#"${value%%[![:space:]]*}"}"
    if [[ "$value" =~ ^\"([^\"]*)\" || "$value" =~ ^\'([^\']*)\' ]]; then
        value="${BASH_REMATCH[1]}"
    else
        value="${value%%[[:space:]]#*}"
        value="${value%"${value##*[![:space:]]}"}"
    fi
    printf '%s\n' "$value"
}

# The .env file, one rule for the scripts and the Python entry points (distqa.config.sources.dotenv_file):
# $ENV_FILE, else .env in the working directory. An ENV_FILE that names no file stops the script here.
env_file="${ENV_FILE:-.env}"
[[ "$env_file" == /* ]] || env_file="$PWD/$env_file"  # the same file after a script's own cd
if [[ -n "${ENV_FILE:-}" && ! -f "$ENV_FILE" ]]; then
    echo "$(basename "$0"): ENV_FILE=$ENV_FILE: no such file; name an existing file, or unset ENV_FILE to read" \
         ".env in the working directory" >&2
    exit 2
fi

# setting NAME DEFAULT: $NAME from the environment, else from the .env file ($env_file), else DEFAULT.
setting() {
    local name="$1" default="$2" value
    value="${!name:-}"
    [[ -n "$value" ]] || value="$(dotenv_value "$name" "$env_file")"
    echo "${value:-$default}"
}

# parse_synthetic_run_args CACHE_FLAG ARGS...: the options of the train_synthetic_* scripts. Sets
# data_dir, run_id, output_dir (callers set their defaults first), cache_dir (the value of CACHE_FLAG,
# e.g. --nq-cache-dir) and trainer_args (what follows `--`, or the first unknown argument onwards).
# -h/--help prints the calling script's header comment.
# shellcheck disable=SC2034  # the variables are the caller's
parse_synthetic_run_args() {
    local cache_flag="$1" script
    script="$(basename "$0")"
    shift
    while [[ $# -gt 0 ]]; do
        case "$1" in
            -h|--help) usage "$0"; exit 0 ;;
            --data-dir|--run-id|--output-dir|"$cache_flag")
                [[ $# -ge 2 && -n "$2" ]] || { echo "$script: $1 needs a value" >&2; exit 2; }
                case "$1" in
                    --data-dir) data_dir="$2" ;;
                    --run-id) run_id="$2" ;;
                    --output-dir) output_dir="$2" ;;
                    *) cache_dir="$2" ;;
                esac
                shift 2 ;;
            --) shift; break ;;
            *) break ;;
        esac
    done
    trainer_args=("$@")
}
