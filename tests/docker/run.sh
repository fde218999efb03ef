#!/usr/bin/env bash
# `make test-docker`: build the real Dockerfile and run a 2-container DDP training with it.
#
# Usage: tests/docker/run.sh [--keep-dockerd] [--build-only] [PYTEST ARGS...]
#
# 1. installs docker.io and debootstrap with apt-get when missing (needs root; a `docker` client without
#    a daemon counts as missing, see tests/docker/tools.sh), starts dockerd when none answers (and stops
#    it again at the end unless --keep-dockerd);
# 2. builds a stand-in base image, since no image registry is reachable here: Debian bookworm from
#    debootstrap + the CPU build of requirements.txt's torch (from a wheelhouse made by this
#    machine's pip), tagged by a hash of its inputs so later runs reuse it;
# 3. builds ./Dockerfile on it (BASE_IMAGE=the stand-in; pip reaches PyPI through the host network),
#    then the Slurm image on that (apt reaches Debian's mirror);
# 4. runs tests/docker/test_image.py: two containers on a user-defined network, one torchrun agent
#    each, train to a checkpoint; and tests/docker/test_slurm_cluster.py: a Slurm 22.05 cluster of
#    containers (tests/docker/slurm_cluster.sh, image tests/docker/slurm.Dockerfile) running
#    scripts/train_slurm.sbatch through real sbatch.
#
# --build-only stops after step 3: `make test` runs it beside the pytest suite, so the downloads and the
# builds (minutes on a fresh machine, mostly waiting on the network) overlap the tests, and the run after
# the suite finds every image built.
#
# Environment: PYTHON (default .venv/bin/python, else python3), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# DISTQA_TEST_IMAGE (tag of the project image, default distqa:test), DISTQA_SLURM_IMAGE (the Slurm image's,
# default distqa-slurm:test).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo_root"
# shellcheck source=scripts/common.sh
source "$repo_root/scripts/common.sh"
find_python "$repo_root"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
image="${DISTQA_TEST_IMAGE:-distqa:test}"
slurm_image="${DISTQA_SLURM_IMAGE:-distqa-slurm:test}"
debian_image=distqa-standin-debian:bookworm
work="$repo_root/build/docker"
keep_dockerd=0
build_only=0
if [[ "${1:-}" == "--keep-dockerd" ]]; then keep_dockerd=1; shift; fi
if [[ "${1:-}" == "--build-only" ]]; then build_only=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0; fi

log() { echo "[test-docker $(date +%T)] $*" >&2; }
die() { echo "tests/docker/run.sh: $*" >&2; exit 1; }
mkdir -p "$work"

# --- 1. tools and daemon --------------------------------------------------------------------
# dockerd and debootstrap live in /usr/sbin, which a non-login root shell may not have on PATH.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin:/sbin" ;; esac
# shellcheck source=tests/docker/tools.sh
source tests/docker/tools.sh
install_docker_tier_tools || exit 1
dockerd_pid=""
stop_dockerd() {
    [[ -n "$dockerd_pid" ]] || return 0
    kill "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$dockerd_pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$dockerd_pid" 2>/dev/null || true
}
if ! docker info >/dev/null 2>&1; then
    (( EUID == 0 )) || die "no Docker daemon answers and only root can start one here"
    log "starting dockerd (log: $work/dockerd.log)"
    dockerd >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    (( keep_dockerd )) || trap stop_dockerd EXIT
    for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || die "dockerd did not answer within 60 s; see $work/dockerd.log"
fi

# --- 2. the stand-in base image ---------------------------------------------------------------
torch_requirement="$(grep -E '^torch==' requirements.txt)" || die "requirements.txt pins no torch==VERSION"
base_tag="$(cat tests/docker/standin-base.Dockerfile /etc/ssl/certs/ca-certificates.crt <(echo "$torch_requirement $mirror") \
            | sha256sum | cut -c1-12)"
base_image="distqa-standin-base:$base_tag"
if docker image inspect "$base_image" >/dev/null 2>&1; then
    log "stand-in base $base_image is cached"
else
    if ! docker image inspect "$debian_image" >/dev/null 2>&1; then
        log "debootstrap Debian bookworm from $mirror (a few minutes)"
        rootfs="$work/rootfs"
        rm -rf "$rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" "$mirror" \
            >"$work/debootstrap.log" 2>&1 || die "debootstrap failed; see $work/debootstrap.log"
        tar -C "$rootfs" -c . | docker import - "$debian_image" >/dev/null
        rm -rf "$rootfs"
    fi
    log "wheelhouse for $torch_requirement (this machine's pip configuration picks the build)"
    context="$work/base-context"
    rm -rf "$context" && mkdir -p "$context/wheelhouse"
    "$PYTHON" -m pip download --quiet --dest "$context/wheelhouse" --python-version 3.11 --only-binary=:all: \
        "$torch_requirement" 2>&1 | grep -v "is ignored" >&2 || true
    ls "$context"/wheelhouse/torch-*.whl >/dev/null 2>&1 || die "pip download $torch_requirement gave no wheel"
    if ls "$context"/wheelhouse/nvidia_* >/dev/null 2>&1; then
        log "warning: the wheelhouse holds the CUDA build of torch (several GB); set PIP_FIND_LINKS or" \
            "PIP_EXTRA_INDEX_URL to a CPU build to keep the stand-in small"
    fi
    cp /etc/ssl/certs/ca-certificates.crt "$context/"
    log "building $base_image"
    docker build --quiet --build-arg "STANDIN_DEBIAN=$debian_image" --build-arg "TORCH_REQUIREMENT=$torch_requirement" \
        -f tests/docker/standin-base.Dockerfile -t "$base_image" "$context" >/dev/null
    rm -rf "$context"
fi

# --- 3. the project image ---------------------------------------------------------------------
log "building $image from ./Dockerfile on $base_image"
docker build --network host --build-arg "BASE_IMAGE=$base_image" --build-arg JUPYTER_REQUIREMENT= \
    -t "$image" . >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; die "docker build failed; see $work/build.log"; }

# The Slurm test cluster's image: the project image with Debian's Slurm and munge (tests/docker/slurm.Dockerfile;
# absent from a fork that left the slurm part out).
if [[ -f tests/docker/slurm.Dockerfile ]]; then
    log "building $slurm_image from tests/docker/slurm.Dockerfile on $image"
    docker build --network host --build-arg "DISTQA_IMAGE=$image" -f tests/docker/slurm.Dockerfile -t "$slurm_image" \
        tests/docker >"$work/build-slurm.log" 2>&1 || { tail -n 40 "$work/build-slurm.log" >&2
        die "docker build of $slurm_image failed; see $work/build-slurm.log"; }
else
    slurm_image=""
fi

# --- 4. the test ------------------------------------------------------------------------------
if (( build_only )); then log "built $image ${slurm_image:+and $slurm_image }(--build-only)"; exit 0; fi

log "2-container DDP run; the Slurm cluster's tests"
DISTQA_TEST_IMAGE="$image" DISTQA_SLURM_IMAGE="$slurm_image" "$PYTHON" -m pytest tests/docker -m docker "$@"
