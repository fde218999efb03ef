"""The Kubeflow jobs of deploy/kubernetes (issue 36): a TrainJob for Trainer v2.3.0, a PyTorchJob and an elastic
PyTorchJob for the training operator v1.9.0.

- Checked against the real schemas: each manifest against its CRD's openAPIV3Schema from ../shared/engines (the
  pinned copies beside the clone), unknown fields refused as a server with strict field validation refuses them,
  plus the create-time rules the schema cannot express (tests/standin/kubernetes_api.py); broken variants each fail
  with a line naming the field.
- Each engine's environment: the variables each pod gets, derived from the manifest as the controllers derive them
  (tests/standin/kubeflow.py), resolved and expanded into the container's command as the kubelet does; worker.sh
  under them starts torchrun with its own flags only (torchrun's own parser reads the environment it gets: no PET_*
  variable, no warning). The two-node runs: tests/distributed/test_kubernetes.py."""

from __future__ import annotations

import copy
import functools
import logging
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from support.processes import clean_env, free_port, node_in_process
from support.repo import REPO_ROOT, WORKER

sys.path.insert(0, str(REPO_ROOT / "tests" / "standin"))
import kubeflow  # tests/standin is not a package
import kubernetes_api

from support.kubernetes import (
    DEPLOY,
    ENGINES,
    IMAGE_WORKER,
    SMALL_RUN,
    containers,
    manifest,
    needs_engines,
    on_this_machine,
    pod,
    runtime,
)

CRDS = {"TrainJob": "trainjobs.trainer.kubeflow.org-v2.3.0.yaml", "PyTorchJob": "pytorchjobs.kubeflow.org-v1.9.0.yaml",
        "ClusterTrainingRuntime": "clustertrainingruntimes.trainer.kubeflow.org-v2.3.0.yaml"}
JOBS = ["trainjob.yaml", "pytorchjob.yaml", "pytorchjob-elastic.yaml"]


@functools.cache
def crd(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CRD's structural schema and its strict JSON Schema (read once: the files are large)."""
    root, api_version, crd_kind = kubernetes_api.crd_schema(ENGINES / CRDS[kind])
    return root, kubernetes_api.strict_json_schema(root, api_version, crd_kind)


def server_problems(resource: dict[str, Any]) -> list[str]:
    """Everything a server with the engine installed refuses in ``resource`` at create time."""
    root, schema = crd(resource["kind"])
    return kubernetes_api.schema_problems(resource, schema) + kubernetes_api.create_time_problems(resource, root)


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


NODES = {"trainjob.yaml": 2, "pytorchjob.yaml": 2, "pytorchjob-elastic.yaml": 2}


def test_every_job_starts_with_the_projects_flags() -> None:
    """Each job's command has worker.sh's --project-args before its "--": project.toml's [jobs] args, a fork's own."""
    for name in JOBS:
        for container in containers(manifest(name)):
            command = [*container.get("command", []), *container.get("args", [])]
            assert "--project-args" in command[:command.index("--")], (name, command)


@needs_engines
def test_the_derived_environments_are_the_controllers() -> None:
    """What the engines' code gives each pod of the three jobs (see tests/standin/kubeflow.py for the lines)."""
    pets = {}
    for name in JOBS:
        for node in range(NODES[name]):
            _, environment = pod(manifest(name), node)
            pets[name, node] = {k: v for k, v in environment.items()
                                if k.startswith("PET_") or k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    assert pets["trainjob.yaml", 1] == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
                                        "PET_MASTER_ADDR": "distqa-node-0-0.distqa", "PET_MASTER_PORT": "29500"}
    assert pets["pytorchjob.yaml", 0] == {
        "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "distqa-master-0",
        "PET_MASTER_ADDR": "distqa-master-0", "WORLD_SIZE": "2", "RANK": "0", "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "2"}
    assert pets["pytorchjob.yaml", 1]["RANK"] == pets["pytorchjob.yaml", 1]["PET_NODE_RANK"] == "1"
    assert pets["pytorchjob-elastic.yaml", 1] == {
        "PET_NPROC_PER_NODE": "auto", "PET_RDZV_ENDPOINT": "distqa-elastic-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "1:2", "PET_MAX_RESTARTS": "3"}
    command, environment = pod(manifest("pytorchjob-elastic.yaml"), 1)
    assert command[:4] == ["bash", IMAGE_WORKER, "--node-rank", "1"] and environment["REPLICA_INDEX"] == "1"
    assert "MLFLOW_TRACKING_TOKEN" not in environment  # an optional Secret that is not there
    # A CPU-only TrainJob: `auto` becomes the CPU request (torch.go lines 131-135).
    cpu = manifest("trainjob.yaml")
    cpu["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "3500m"}, "limits": {"cpu": 8}}
    assert dict((e["name"], e.get("value")) for e in kubeflow.trainjob_env(cpu, runtime())[0])["PET_NPROC_PER_NODE"] \
        == "4"


def probe_agent(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
                env: dict[str, str]) -> tuple[dict[str, Any], str]:
    """The node (distqa.launch.node, in this process) under the pod's command line and environment, its agent replaced
    by torchrun's own parser under the environment the node leaves it (what torchrun makes of it: PET_* variables
    left, its warnings); node 0's store, which is not there, counts as reached. The rest is real."""
    from torch.distributed.run import config_from_args, parse_args

    from distqa.launch import node, reachability

    environ = dict(env)
    seen: dict[str, Any] = {}

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen["warnings"].append(record.getMessage())

    def agent(args: list[str]) -> int:
        seen["warnings"] = []
        keep = Keep(logging.WARNING)
        logging.getLogger().addHandler(keep)
        try:
            with mock.patch.dict(os.environ, environ, clear=True):
                options = parse_args(args[1:])  # torchrun's own parser, under the environment the node gives it
                if options.standalone:  # as torch.distributed.run.run does before config_from_args
                    options.rdzv_backend, options.rdzv_endpoint = "c10d", "localhost:0"
                config, _, _ = config_from_args(options)
                seen.update(node_rank=args[0], pet=sorted(k for k in os.environ if k.startswith("PET_")),
                            left=sorted(k for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
                                        if k in os.environ),
                            nodes=[config.min_nodes, config.max_nodes], nproc=config.nproc_per_node,
                            endpoint=config.rdzv_endpoint, run_id=config.run_id, max_restarts=config.max_restarts,
                            conf=config.rdzv_configs, standalone=options.standalone)
        finally:
            logging.getLogger().removeHandler(keep)
        return 0

    monkeypatch.setattr(node, "run_agent", agent)
    monkeypatch.setattr(reachability, "wait_for_rendezvous", lambda *_: None)
    monkeypatch.setattr(sys, "path", list(sys.path))
    checked = node.read_node(argv[2:], environ)
    assert checked is not None and node.start(checked, environ, REPO_ROOT) == 0
    return seen, capsys.readouterr().err


def engine_cases(nodes: int) -> list[Any]:
    """(job, node) for each job; a TrainJob's need the pinned runtime (its ML policy) of ../shared/engines."""
    return [pytest.param(name, node, marks=[needs_engines] if name == "trainjob.yaml" else [])
            for name in JOBS for node in range(nodes)]


@pytest.mark.parametrize(("name", "node"), engine_cases(2))
def test_worker_sh_under_each_engines_variables_gives_torchrun_its_own_flags_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str,
        node: int) -> None:
    resource = manifest(name)
    port = free_port()
    argv, env = on_this_machine(resource, *pod(resource, node), port, tmp_path, SMALL_RUN)
    agent, stderr = probe_agent(monkeypatch, capsys, argv, env)
    elastic = name == "pytorchjob-elastic.yaml"
    assert agent["pet"] == [] and agent["left"] == [] and agent["warnings"] == [], agent
    assert agent["node_rank"] == str(node) and agent["nodes"] == ([1, 2] if elastic else [2, 2])
    assert agent["nproc"] == 1 and agent["max_restarts"] == 3 and not agent["standalone"]
    assert agent["run_id"] == resource["metadata"]["name"]  # the manifests' RUN_ID
    assert agent["endpoint"] == f"127.0.0.1:{port}" and agent["conf"]["is_host"] == str(int(node == 0))
    assert "warning" not in stderr.lower(), stderr


def test_a_standalone_elastic_job_runs_one_node_and_its_empty_pet_standalone_never_reaches_torchrun(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """elasticPolicy.standalone gives PET_STANDALONE="" (elastic.go line 114): torch 2.13's torchrun reads it as
    ``bool(int(""))``, a ValueError, when it reaches torchrun's parser."""
    resource = manifest("pytorchjob-elastic.yaml")
    resource["spec"]["elasticPolicy"] |= {"standalone": True, "minReplicas": 1, "maxReplicas": 1}
    resource["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 1
    argv, env = on_this_machine(resource, *pod(resource, 0), free_port(), tmp_path, SMALL_RUN)
    assert env["PET_STANDALONE"] == ""
    agent, _ = probe_agent(monkeypatch, capsys, argv, env)
    assert agent["standalone"] and agent["nodes"] == [1, 1] and agent["pet"] == [] and agent["warnings"] == []
    torchrun = subprocess.run([sys.executable, "-c", "from torch.distributed.run import parse_args; parse_args(['x'])"],
                              env=clean_env(PET_STANDALONE=""), capture_output=True, text=True, timeout=60)
    assert "ValueError: invalid literal for int() with base 10: ''" in torchrun.stderr, "what worker.sh keeps out"


def test_a_kubeflow_variable_worker_sh_cannot_follow_stops_it_in_one_line() -> None:
    """Through worker.sh itself; every such variable's line: tests/launchers/test_node_options.py
    (test_a_kubeflow_variable_the_node_cannot_follow_is_one_line)."""
    result = subprocess.run(["bash", WORKER, "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                            env=clean_env(PYTHON=sys.executable, PET_LOG_DIR="/logs"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("worker.sh: PET_LOG_DIR is a torchrun option that worker.sh does not read"), \
        result.stderr


def test_a_flag_given_to_worker_sh_wins_over_the_engines_variable(tmp_path: Path) -> None:
    result = node_in_process(["--dry-run", "--nnodes", "1", "--node-rank", "0", "--", *SMALL_RUN, "--output-dir",
                              str(tmp_path)], clean_env(PYTHON=sys.executable, PET_NNODES="2", PET_NODE_RANK="1",
                                                        PET_MASTER_ADDR="job-node-0-0.job", PET_MASTER_PORT="29500"))
    assert result.returncode == 0, result.stderr
    assert "--standalone" in result.stdout and "1 node (standalone)" in result.stderr

# Node 1 as each engine describes it: its node count, its rank, and node 0's address.
ENGINE_NODE_1 = {
    "kubeflow": {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-node-0-0.job",
                 "PET_MASTER_PORT": "29500"},
    "skypilot": {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_NODES": "2",
                 "SKYPILOT_NUM_GPUS_PER_NODE": "0"},
}


@pytest.mark.parametrize("engine", list(ENGINE_NODE_1))
def test_an_engines_node_0_address_serves_the_other_nodes_but_never_stands_for_an_external_store(engine: str) -> None:
    """Kubeflow's and SkyPilot's variables are the defaults of the same flags, read the same way: node 1 meets node
    0 at the engine's address for it, ``--master-addr`` wins over it, and with ``--external-store`` the store's
    address must be given (no engine runs the store, so no engine's name for node 0 is its address)."""
    node_0 = "job-node-0-0.job" if engine == "kubeflow" else "10.0.0.1"
    port = "29500" if engine == "kubeflow" else "29400"

    def dry_run(*flags: str) -> subprocess.CompletedProcess[str]:
        return node_in_process(["--dry-run", "--run-id", "engine", *flags, "--", "--preset", "none"],
                               clean_env(PYTHON=sys.executable, NODE_ADDR="10.0.0.2", **ENGINE_NODE_1[engine]))

    def endpoint(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
        assert result.returncode == 0, result.stderr
        command = shlex.split(result.stdout)
        conf = dict(item.split("=") for item in command[command.index("--rdzv-conf") + 1].split(","))
        return command[command.index("--rdzv-endpoint") + 1], conf["is_host"]

    assert endpoint(dry_run()) == (f"{node_0}:{port}", "0")
    assert endpoint(dry_run("--master-addr", "10.9.9.9")) == (f"10.9.9.9:{port}", "0")
    assert endpoint(dry_run("--external-store", "--master-addr", "10.9.9.9")) == (f"10.9.9.9:{port}", "0")
    for node_rank in ("1", "0"):
        refused = dry_run("--external-store", "--node-rank", node_rank)
        assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("worker.sh: --external-store needs --master-addr: the address of the host "
                                         "running python -m distqa.launch.rendezvous_store"), refused.stderr
