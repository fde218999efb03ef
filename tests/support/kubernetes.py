"""What tests/launchers/test_kubernetes.py and tests/distributed/test_kubernetes.py share (template.toml's
part kubernetes): the deploy/kubernetes manifests, the pinned engines' CRDs, and a job's pod run as a process on
this machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.processes import clean_env
from support.repo import MACHINERY_ARGS, REPO_ROOT, WORKER

sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
import kubeflow  # tests/standin is not a package

ENGINES = Path(__file__).resolve().parents[3] / "shared" / "engines"
needs_engines = pytest.mark.skipif(not ENGINES.is_dir(),
                                   reason=f"{ENGINES} is absent (the pinned CRDs beside the clone)")
DEPLOY = REPO_ROOT / "deploy" / "kubernetes"
IMAGE_WORKER = "/project/scripts/worker.sh"
"""Where the image holds worker.sh (the Dockerfile copies the repository to /project)."""


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))


def runtime() -> dict[str, Any]:
    return yaml.safe_load((ENGINES / "torch-distributed-runtime-v2.3.0.yaml").read_text(encoding="utf-8"))


def containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers that run distqa: the TrainJob's trainer, each PyTorchJob replica's ``pytorch``."""
    if resource["kind"] == "TrainJob":
        return [resource["spec"]["trainer"]]
    return [c for r in resource["spec"]["pytorchReplicaSpecs"].values() for c in r["template"]["spec"]["containers"]
            if c.get("name") == "pytorch"]


def pod(resource: dict[str, Any], node: int) -> tuple[list[str], dict[str, str]]:
    """The command and the environment of node ``node``'s container, as the engine's controller and the kubelet
    make them: a TrainJob's pod ``<name>-node-0-<node>`` (its completion index ``node``); a PyTorchJob's Master 0
    and Worker ``node - 1``, or with an elasticPolicy Worker ``node`` (its replica index in a label)."""
    name = resource["metadata"]["name"]
    if resource["kind"] == "TrainJob":
        env, _ = kubeflow.trainjob_env(resource, runtime())
        metadata = kubeflow.pod_metadata(f"{name}-node-0-{node}", annotations={kubeflow.COMPLETION_INDEX: str(node)})
        container = kubeflow.trainjob_container(resource)
    else:
        elastic = "elasticPolicy" in resource["spec"]
        role, index = ("Worker", node) if elastic else (("Master", 0) if node == 0 else ("Worker", node - 1))
        env = kubeflow.pytorchjob_env(resource, role, index)
        metadata = kubeflow.pod_metadata(f"{name}-{role.lower()}-{index}",
                                         labels={kubeflow.REPLICA_INDEX_LABEL: str(index)})
        container = next(c for c in resource["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"]
                         if c["name"] == "pytorch")
    environment = kubeflow.container_environment(env, metadata)
    return kubeflow.container_command(container, environment), environment


def on_this_machine(resource: dict[str, Any], command: list[str], environment: dict[str, str], port: int,
                    output_dir: Path, trainer_args: list[str], **extra: str) -> tuple[list[str], dict[str, str]]:
    """An emulated node's command and environment: the image's worker.sh is the checkout's, the pods' DNS names are
    127.0.0.1 (and NODE_ADDR, as the local launcher sets it), the engine's port is ``port``, the volume's mount is
    ``output_dir``, the interface is loopback, and the trainer arguments after ``--`` are ``trainer_args``."""
    name = resource["metadata"]["name"]
    hosts = [f"{name}-node-0-0.{name}", f"{name}-master-0", f"{name}-worker-0"]
    local = {}
    for key, value in environment.items():
        for host in hosts:
            value = value.replace(host, "127.0.0.1")
        local[key] = value
    for key in ("PET_MASTER_PORT", "MASTER_PORT"):
        if key in local:
            local[key] = str(port)
    if "PET_RDZV_ENDPOINT" in local:
        local["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{port}"
    local |= {"DISTQA_OUTPUT_DIR": str(output_dir), "HF_HOME": str(output_dir / "hf"), "NCCL_SOCKET_IFNAME": "lo",
              "GLOO_SOCKET_IFNAME": "lo"}
    assert command[:2] == ["bash", IMAGE_WORKER], command
    dash = command.index("--")
    # The job starts with the project's own trainer flags (--project-args: project.toml's, the GPU preset); here the
    # machinery task's ``trainer_args`` stand in for them (test_every_job_starts_with_the_projects_flags).
    own = [word for word in command[2:dash] if word != "--project-args"]
    argv = ["bash", WORKER, *own, "--", *trainer_args]
    return argv, clean_env(PYTHON=sys.executable, NODE_ADDR="127.0.0.1", OMP_NUM_THREADS="1") | local | extra


SMALL_RUN = [*MACHINERY_ARGS, "--global-batch-size", "8", "--per-rank-batch-size", "4"]
