# Test only: the project image with Debian bookworm's Slurm 22.05 and munge, for the Slurm test cluster
# (tests/docker/slurm_cluster.sh, tests/docker/test_slurm_cluster.py). One image for every container: the
# controller runs slurmctld, slurmdbd and MariaDB (sacct reads slurmdbd only), each compute node slurmd.
#
#   docker build -f tests/docker/slurm.Dockerfile --build-arg DISTQA_IMAGE=distqa:test -t distqa-slurm:test tests/docker
ARG DISTQA_IMAGE=distqa:test
FROM ${DISTQA_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The versions are bookworm's (22.05.8, munge 0.5.15, MariaDB 10.11): the stand-in base's sources list bookworm main.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurmctld slurmd slurm-client slurmdbd munge mariadb-server \
    && rm -rf /var/lib/apt/lists/* \
    && slurmd -V
COPY slurm_node.sh /usr/local/bin/distqa-slurm-node
ENTRYPOINT ["/usr/local/bin/distqa-slurm-node"]
