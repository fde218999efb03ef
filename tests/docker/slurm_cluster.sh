#!/usr/bin/env bash
# A Slurm 22.05 cluster of containers on this machine: a controller (slurmctld, slurmdbd) and compute nodes
# (slurmd), each a container of the Slurm image (tests/docker/slurm.Dockerfile) on a Docker network of its own,
# all mounting SHARED at /shared: the shared file system, holding the checkout (/shared/project, copied from the
# image's /project), the results and Slurm's configuration and logs (/shared/slurm).
#
#   tests/docker/slurm_cluster.sh up SHARED [NAME] [NODES]   # start; returns once every node is idle
#   tests/docker/slurm_cluster.sh down [NAME]                # remove NAME's containers and network
#   docker exec -w /shared/project NAME-ctl sbatch --wait scripts/train_slurm.sbatch -- --max-steps 4
#
# NAME (default distqa-slurm) prefixes the containers (NAME-ctl, NAME-node1, ...) and is the network's name;
# inside it the hosts are slurmctl, node1, node2, ... NODES: compute nodes, default 2.
# Environment: DISTQA_SLURM_IMAGE, the image (default distqa-slurm:test; tests/docker/run.sh builds it).
set -euo pipefail

image="${DISTQA_SLURM_IMAGE:-distqa-slurm:test}"
action="${1:-}"
die() { echo "tests/docker/slurm_cluster.sh: $*" >&2; exit 1; }

down() {  # down NAME: only what `up NAME` made
    local name="$1" containers
    containers="$(docker ps -aq --filter "name=^${name}-(ctl|node[0-9]+)$")"
    # shellcheck disable=SC2086 # one word per container id
    [[ -z "$containers" ]] || docker rm --force $containers >/dev/null
    docker network rm "$name" >/dev/null 2>&1 || true
}

# slurm.conf for NODES compute nodes. Each setting that differs from a site's says why.
slurm_conf() {
    local nodes="$1"
    cat <<EOF
ClusterName=distqa
SlurmctldHost=slurmctl
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only when its credentials have expired (default 120 s): 20 s keeps the test short.
AuthInfo=cred_expire=20
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/shared/slurm/log/slurmctld.log
SlurmdLogFile=/shared/slurm/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Containers: no cgroup hierarchy of their own to delegate, so processes are tracked by parentage and tasks are
# not bound to CPUs (a site uses proctrack/cgroup and task/cgroup,task/affinity).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
# The nodes declare 16 CPUs on a 2-core machine, so that two jobs of train_slurm.sbatch (--cpus-per-task=8) run
# side by side: slurmd keeps the configured sizes instead of refusing to register.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A node that stops answering is DOWN after 10 s (default 300), and comes back by itself when its slurmd returns.
SlurmdTimeout=10
ReturnToService=2
# Job records stay in slurmctld's memory for 10 min (scontrol show job; scontrol requeue of a finished job).
MinJobAge=600
KillWait=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=slurmctl
JobCompType=jobcomp/none
NodeName=node[1-$nodes] CPUs=16 RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE State=UP
EOF
}

slurmdbd_conf() {
    cat <<EOF
AuthType=auth/munge
DbdHost=slurmctl
SlurmUser=root
LogFile=/shared/slurm/log/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
}

up() {  # up SHARED NAME NODES
    local shared="$1" name="$2" nodes="$3" host role
    [[ -d "$shared" ]] || die "the shared folder '$shared' does not exist"
    [[ "$nodes" =~ ^[1-9][0-9]?$ ]] || die "NODES must be a number from 1 to 99, got '$nodes'"
    docker image inspect "$image" >/dev/null 2>&1 || die "no image $image; build it with tests/docker/run.sh --build-only"
    shared="$(cd "$shared" && pwd)"
    down "$name"
    mkdir -p "$shared/slurm/etc" "$shared/slurm/log" "$shared/results"
    head -c 1024 /dev/urandom >"$shared/slurm/etc/munge.key"
    slurm_conf "$nodes" >"$shared/slurm/etc/slurm.conf"
    slurmdbd_conf >"$shared/slurm/etc/slurmdbd.conf"
    docker network create "$name" >/dev/null
    for host in slurmctl $(seq -f 'node%g' 1 "$nodes"); do
        role=compute
        [[ "$host" == slurmctl ]] && role=controller
        docker run --detach --name "$name-${host/slurmctl/ctl}" --hostname "$host" --network "$name" \
            --network-alias "$host" --volume "$shared:/shared" "$image" "$role" >/dev/null
    done
    # The checkout on the shared file system, as a site's home or project space: jobs are submitted from it.
    docker exec "$name-ctl" cp -a /project /shared/project
    for _ in $(seq 120); do
        [[ "$(docker exec "$name-ctl" sinfo --noheader --states=idle --format=%D 2>/dev/null)" == "$nodes" ]] && return 0
        docker ps --quiet --filter "name=^$name-ctl$" --filter status=running | grep -q . \
            || die "the controller exited: $(docker logs "$name-ctl" 2>&1 | tail -n 5)"
        sleep 1
    done
    die "the $nodes nodes were not idle within 120 s: $(docker exec "$name-ctl" sinfo 2>&1); logs in $shared/slurm/log"
}

case "$action" in
    up) [[ $# -ge 2 ]] || die "usage: $0 up SHARED [NAME] [NODES]"
        up "$2" "${3:-distqa-slurm}" "${4:-2}" ;;
    down) down "${2:-distqa-slurm}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' ;;
    *) die "usage: $0 up SHARED [NAME] [NODES] | down [NAME]" ;;
esac
