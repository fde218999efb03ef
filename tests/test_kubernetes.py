"""The Kubeflow jobs of deploy/kubernetes (issue 36): a TrainJob for Trainer v2.3.0, a PyTorchJob and an elastic
PyTorchJob for the training operator v1.9.0.

- Checked against the real schemas: each manifest against its CRD's openAPIV3Schema from ../shared/engines (the
  pinned copies beside the clone), unknown fields refused as a server with strict field validation refuses them,
  plus the create-time rules the schema cannot express (tests/standin/kubernetes_api.py); broken variants each fail
  with a line naming the field.
- Run with each engine's environment: the variables each pod gets, derived from the manifest as the controllers
  derive them (tests/standin/kubeflow.py), resolved and expanded into the container's command as the kubelet does;
  worker.sh under them starts torchrun with its own flags only (torchrun's own parser reads the environment it
  gets: no PET_* variable, no warning); two emulated nodes (processes on 127.0.0.1, the pods' DNS names replaced by
  127.0.0.1 as the local launcher does, the engine's port by a free one) train, lose a node, and resume.
"""

from __future__ import annotations

import copy
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
import kubeflow  # tests/standin is not a package
import kubernetes_api

ENGINES = Path(__file__).resolve().parents[2] / "shared" / "engines"
needs_engines = pytest.mark.skipif(not ENGINES.is_dir(),
                                   reason=f"{ENGINES} is absent (the pinned CRDs beside the clone)")
DEPLOY = REPO_ROOT / "deploy" / "kubernetes"
CRDS = {"TrainJob": "trainjobs.trainer.kubeflow.org-v2.3.0.yaml", "PyTorchJob": "pytorchjobs.kubeflow.org-v1.9.0.yaml",
        "ClusterTrainingRuntime": "clustertrainingruntimes.trainer.kubeflow.org-v2.3.0.yaml"}
JOBS = ["trainjob.yaml", "pytorchjob.yaml", "pytorchjob-elastic.yaml"]
IMAGE_WORKER = "/project/scripts/worker.sh"
"""Where the image holds worker.sh (the Dockerfile copies the repository to /project)."""


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))


def runtime() -> dict[str, Any]:
    return yaml.safe_load((ENGINES / "torch-distributed-runtime-v2.3.0.yaml").read_text(encoding="utf-8"))


@functools.cache
def crd(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CRD's structural schema and its strict JSON Schema (read once: the files are large)."""
    root, api_version, crd_kind = kubernetes_api.crd_schema(ENGINES / CRDS[kind])
    return root, kubernetes_api.strict_json_schema(root, api_version, crd_kind)


def server_problems(resource: dict[str, Any]) -> list[str]:
    """Everything a server with the engine installed refuses in ``resource`` at create time."""
    root, schema = crd(resource["kind"])
    return kubernetes_api.schema_problems(resource, schema) + kubernetes_api.create_time_problems(resource, root)


def containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers that run distqa: the TrainJob's trainer, each PyTorchJob replica's ``pytorch``."""
    if resource["kind"] == "TrainJob":
        return [resource["spec"]["trainer"]]
    return [c for r in resource["spec"]["pytorchReplicaSpecs"].values() for c in r["template"]["spec"]["containers"]
            if c.get("name") == "pytorch"]


def project_problems(resource: dict[str, Any]) -> list[str]:
    """What the server accepts but would not run distqa: each container names an image (a TrainJob without one runs
    the runtime's stock PyTorch image, which holds no distqa) and runs the image's worker.sh, and the run directory
    is on the ReadWriteMany claim of storage.yaml."""
    problems = []
    for index, container in enumerate(containers(resource)):
        if not container.get("image"):
            problems.append(f"container {index}: image: required (the project's image; the runtime's has no distqa)")
        if container.get("command", [])[-1:] != [IMAGE_WORKER]:
            problems.append(f"container {index}: command must run {IMAGE_WORKER}, not {container.get('command')}")
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if env.get("DISTQA_OUTPUT_DIR") != "/project/results":
            problems.append(f"container {index}: DISTQA_OUTPUT_DIR must be /project/results (the shared volume)")
    text = (DEPLOY / "storage.yaml").read_text(encoding="utf-8")
    claim = yaml.safe_load(text)
    if claim["spec"]["accessModes"] != ["ReadWriteMany"] or f"claimName: {claim['metadata']['name']}" not in \
            (DEPLOY / "trainjob.yaml").read_text() + (DEPLOY / "pytorchjob.yaml").read_text():
        problems.append("storage.yaml: the jobs' claim must be ReadWriteMany")
    return problems


# --- (a) the schemas ----------------------------------------------------------------------------------------------

@needs_engines
@pytest.mark.parametrize("name", JOBS)
def test_each_job_passes_its_crd_schema_the_create_time_rules_and_the_projects(name: str) -> None:
    resource = manifest(name)
    assert server_problems(resource) == []
    assert project_problems(resource) == []


@needs_engines
def test_the_check_passes_the_pinned_runtime_and_the_trainjobs_patch_targets_its_node_container() -> None:
    torch_runtime = runtime()
    assert server_problems(torch_runtime) == [], "the validator refuses the engine's own runtime"
    (patch,) = manifest("trainjob.yaml")["spec"]["runtimePatches"]
    for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        (target,) = [j for j in torch_runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == job["name"]]
        names = {c["name"] for c in target["template"]["spec"]["template"]["spec"]["containers"]}
        assert {c["name"] for c in job["template"]["spec"]["template"]["spec"]["containers"]} <= names


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change at ``path`` (dots and [index]); a value of ``...`` deletes the field."""
    def change(resource: dict[str, Any]) -> None:
        parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
        node = resource
        for part in parts[:-1]:
            node = node[part]
        if value is ...:
            del node[parts[-1]]
        else:
            node[parts[-1]] = value
    return change


def _rename(path: str, new: str) -> Callable[[dict[str, Any]], None]:
    def change(resource: dict[str, Any]) -> None:
        parts = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
        node = resource
        for part in parts[:-1]:
            node = node[part]
        node[new] = node.pop(parts[-1])
    return change


POD = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
MASTER = "spec.pytorchReplicaSpecs.Master.template.spec"
BROKEN = {
    "trainjob: a typo deep in the pod spec": (
        "trainjob.yaml", _rename(f"{POD}.containers[0].volumeMounts[0].mountPath", "mountpath"),
        f'unknown field "{POD}.containers[0].volumeMounts[0].mountpath"'),
    "trainjob: a typo in the trainer": (
        "trainjob.yaml", _rename("spec.trainer.command", "comand"), 'unknown field "spec.trainer.comand"'),
    "trainjob: a wrong type": (
        "trainjob.yaml", _set("spec.trainer.numNodes", "2"), "spec.trainer.numNodes: '2' is not of type 'integer'"),
    "trainjob: a volume of no kind": (
        "trainjob.yaml", _set(f"{POD}.volumes[0].persistentVolumeClaim", {"claim": "x"}),
        f'unknown field "{POD}.volumes[0].persistentVolumeClaim.claim"'),
    "trainjob: no runtime name": (
        "trainjob.yaml", _set("spec.runtimeRef.name", ...), "spec.runtimeRef: 'name' is a required property"),
    "trainjob: an uppercase name": (
        "trainjob.yaml", _set("metadata.name", "DistQA"), "metadata.name: 'DistQA': metadata.name must match RFC 1035"),
    "trainjob: a name of 64 characters": (
        "trainjob.yaml", _set("metadata.name", "d" * 64), "metadata.name must be no more than 63 characters (64)"),
    "trainjob: a reserved variable": (
        "trainjob.yaml", lambda r: r["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"}),
        "spec.trainer.env: must not have reserved envs, invalid envs configured: ['PET_NNODES']"),
    "trainjob: a label that is not a string": (
        "trainjob.yaml", _set("metadata.labels", {"team": 1}), "metadata.labels.team: 1 is not of type 'string'"),
    "trainjob: an unknown metadata field": (
        "trainjob.yaml", _set("metadata.nmae", "x"), 'unknown field "metadata.nmae"'),
    "pytorchjob: a typo in the resources": (
        "pytorchjob.yaml", _rename(f"{MASTER}.containers[0].resources.limits", "limit"),
        f'unknown field "{MASTER}.containers[0].resources.limit"'),
    "pytorchjob: a port as a string": (
        "pytorchjob.yaml", _set(f"{MASTER}.containers[0].ports[0].containerPort", "23456"),
        f"{MASTER}.containers[0].ports[0].containerPort: '23456' is not of type 'integer'"),
    "pytorchjob: a GPU count that is neither a number nor a string": (
        "pytorchjob.yaml", _set(f"{MASTER}.containers[0].resources.limits", {"nvidia.com/gpu": [1]}),
        f"{MASTER}.containers[0].resources.limits.nvidia.com/gpu: [1] is not of type 'integer'"),
    "pytorchjob: a missing image": (
        "pytorchjob.yaml", _set("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].image", ...),
        "spec.pytorchReplicaSpecs[Worker].template.spec.containers[0].image: Required value"),
    "pytorchjob: two Masters": (
        "pytorchjob.yaml", _set("spec.pytorchReplicaSpecs.Master.replicas", 2),
        "spec.pytorchReplicaSpecs[Master].replicas: Forbidden: must be 1"),
    "pytorchjob: no container named pytorch": (
        "pytorchjob.yaml", _set(f"{MASTER}.containers[0].name", "trainer"),
        "spec.pytorchReplicaSpecs[Master].template.spec.containers: Required value: must have at least one container "
        "with name pytorch"),
    "pytorchjob: a name with an underscore": (
        "pytorchjob.yaml", _set("metadata.name", "dist_qa"), "metadata.name: 'dist_qa' should match"),
    "pytorchjob-elastic: a typo in the elastic policy": (
        "pytorchjob-elastic.yaml", _rename("spec.elasticPolicy.maxReplicas", "maxReplica"),
        'unknown field "spec.elasticPolicy.maxReplica"'),
    "pytorchjob-elastic: a typo in the downward API": (
        "pytorchjob-elastic.yaml",
        _rename("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env[0].valueFrom.fieldRef", "fieldref"),
        'unknown field "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env[0].valueFrom.fieldref"'),
    "pytorchjob-elastic: no Worker": (
        "pytorchjob-elastic.yaml", _rename("spec.pytorchReplicaSpecs.Worker", "Workers"),
        "spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used"),
}


@needs_engines
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_variant_fails_naming_the_field(case: str) -> None:
    name, change, expected = BROKEN[case]
    resource = copy.deepcopy(manifest(name))
    change(resource)
    problems = server_problems(resource)
    assert any(expected in problem for problem in problems), problems


def test_a_trainjob_without_an_image_passes_the_server_and_fails_the_projects_check() -> None:
    """The runtime's own image is the default: the server has nothing to refuse, but it holds no distqa."""
    resource = manifest("trainjob.yaml")
    del resource["spec"]["trainer"]["image"]
    assert project_problems(resource) == [
        "container 0: image: required (the project's image; the runtime's has no distqa)"]


def test_the_strict_schema_refuses_what_pruning_drops_and_keeps_what_it_keeps() -> None:
    structural = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "open": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"n": {"type": "integer"}}},
        "bare": {"type": "object"},
        "map": {"type": "object", "additionalProperties": {"type": "string"}},
        "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "maybe": {"type": "string", "nullable": True},
        "embedded": {"type": "object", "x-kubernetes-embedded-resource": True,
                     "properties": {"spec": {"type": "object", "properties": {}}}}}}}}
    schema = kubernetes_api.strict_json_schema(structural, "example.com/v1", "Thing")
    good = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "a"},
            "spec": {"open": {"anything": [1], "n": 2}, "map": {"k": "v"}, "port": "http", "maybe": None,
                     "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"a": "b"}}, "spec": {}}}}
    assert kubernetes_api.schema_problems(good, schema) == []
    bad = copy.deepcopy(good)
    bad["spec"].update(bare={"x": 1}, port=1.5)
    bad["spec"]["open"]["n"] = "two"
    bad["spec"]["embedded"]["spec"] = {"y": 1}
    bad["spec"]["embedded"]["metadata"] = {"labels": {"a": 1}}
    bad["kind"] = "Other"
    assert kubernetes_api.schema_problems(bad, schema) == sorted([
        "kind: 'Thing' was expected", 'unknown field "spec.bare.x"', "spec.port: 1.5 is not of type 'integer'",
        "spec.open.n: 'two' is not of type 'integer'", 'unknown field "spec.embedded.spec.y"',
        "spec.embedded.metadata.labels.a: 1 is not of type 'string'"])


# --- (b) each engine's environment --------------------------------------------------------------------------------

def test_the_kubelets_expansion() -> None:
    values = {"A": "1", "B": "$(A)"}.get
    assert kubeflow.expand("$(A)-$(B)", values) == "1-$(A)"  # a value is not expanded again
    assert kubeflow.expand("$$(A) $(NONE) $( $x $", values) == "$(A) $(NONE) $( $x $"
    assert kubeflow.container_environment(
        [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)/$(C)"}, {"name": "C", "value": "c"}],
        kubeflow.pod_metadata("p")) == {"A": "x", "B": "x/$(C)", "C": "c"}
