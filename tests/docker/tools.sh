# shellcheck shell=bash
# The Docker tier's tools: sourced by tests/docker/run.sh, and by tests/launchers/test_docker_tools.py with a PATH
# of its own making, so the install decision is tested where it is made.

# The Debian packages the Docker tier still needs, space-separated (nothing when all is there).
# A `docker` client alone is not enough: many machines ship the client binary without the daemon, so
# docker.io is needed unless a daemon already answers or a `dockerd` is there to be started.
docker_tier_missing_packages() {
    local packages=()
    if ! command -v docker >/dev/null; then
        packages+=(docker.io)
    elif ! command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
        packages+=(docker.io)
    fi
    command -v debootstrap >/dev/null || packages+=(debootstrap)
    echo "${packages[*]}"
}

# Install what docker_tier_missing_packages names, then check that it arrived. Prints what it does
# on stderr; returns non-zero with a message saying what could not be done and what to do instead.
install_docker_tier_tools() {
    local missing
    missing="$(docker_tier_missing_packages)"
    [[ -n "$missing" ]] || return 0
    if (( EUID != 0 )); then
        echo "tests/docker/run.sh: the Docker tier needs $missing; install them (sudo apt-get install -y $missing)" \
             "or run as root, which installs them" >&2
        return 1
    fi
    echo "tests/docker/run.sh: installing $missing (apt-get)" >&2
    # shellcheck disable=SC2086 # one word per package
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; }; then
        echo "tests/docker/run.sh: could not install $missing with apt-get (output above); install Docker" \
             "Engine (dockerd) and debootstrap by hand, then run make test-docker again" >&2
        return 1
    fi
    missing="$(docker_tier_missing_packages)"
    if [[ -n "$missing" ]]; then
        echo "tests/docker/run.sh: apt-get installed the packages but this is still missing: $missing" \
             "(PATH=$PATH); is /usr/sbin on PATH?" >&2
        return 1
    fi
}
