# Helpers shared by the scripts that run inside a job or container (sourced, not run).
# shellcheck shell=bash

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
