#!/usr/bin/env bash
# The entry point of each container of the Slurm test cluster (tests/docker/slurm_cluster.sh starts them):
#
#   distqa-slurm-node controller   # munged, MariaDB, slurmdbd (sacct's accounting) and slurmctld in the foreground
#   distqa-slurm-node compute      # munged and slurmd in the foreground: `docker kill` is the node lost
#
# Every container mounts the cluster's shared file system at /shared; slurm_cluster.sh wrote there, before any
# container started, the one munge key, slurm.conf and slurmdbd.conf (/shared/slurm/etc) and made /shared/slurm/log.
# The daemons run as root (SlurmUser=root): the test image has no other user that needs to own the job's files.
set -euo pipefail

role="${1:-}"
etc=/shared/slurm/etc
[[ "$role" == controller || "$role" == compute ]] || {
    echo "distqa-slurm-node: the role must be 'controller' or 'compute', got '$role'" >&2; exit 2; }
[[ -f "$etc/slurm.conf" && -f "$etc/munge.key" ]] || {
    echo "distqa-slurm-node: no $etc/slurm.conf or munge.key; start the cluster with tests/docker/slurm_cluster.sh" >&2
    exit 2; }

# munge: every daemon and client authenticates with the one key; munged refuses a key others can read.
install -o munge -g munge -m 0400 "$etc/munge.key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- /usr/sbin/munged
install -m 0644 "$etc/slurm.conf" /etc/slurm/slurm.conf

# Bounded waits: a daemon that never answers ends this container with its log named, not a hang.
wait_for() {  # wait_for WHAT COMMAND...: up to 60 s
    local what="$1"; shift
    for _ in $(seq 120); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
    echo "distqa-slurm-node: $what did not answer within 60 s" >&2; exit 1
}

if [[ "$role" == compute ]]; then
    mkdir -p /var/spool/slurmd
    # -D: slurmd is this container's main process, so killing the container is losing the node.
    exec slurmd -D -s
fi

# The controller: MariaDB for slurmdbd (sacct reads only slurmdbd; Slurm 22.05 has no file-based accounting).
install -d -o mysql -g mysql /run/mysqld
mariadbd --user=mysql --bind-address=127.0.0.1 >/shared/slurm/log/mariadb.log 2>&1 &
wait_for MariaDB mariadb-admin ping
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
# slurmdbd refuses a configuration file (it holds the database password) that others can read.
install -m 0600 "$etc/slurmdbd.conf" /etc/slurm/slurmdbd.conf
slurmdbd
wait_for slurmdbd bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
mkdir -p /var/spool/slurmctld
exec slurmctld -D -i
