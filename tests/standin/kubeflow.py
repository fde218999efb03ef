"""The environment and command a Kubeflow pod's container gets, derived from a manifest as the controllers and the
kubelet derive them, for emulated nodes (tests/launchers/test_kubernetes.py). Each function follows the code it names; a
difference from it is a bug here.

- :func:`trainjob_env`: Trainer v2.3.0 (kubeflow/trainer tag v2.3.0, commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab),
  pkg/runtime/framework/plugins/torch/torch.go ``EnforceMLPolicy`` lines 110-204;
- :func:`pytorchjob_env`: the training operator v1.9.0 (kubeflow/training-operator tag v1.9.0, commit
  6f74c7f6b2ed6c27aabd82d0a316b23f0646059c), pkg/controller.v1/pytorch/envvar.go ``setPodEnv`` lines 43-127,
  master.go ``Generate`` lines 33-62, elastic.go ``Generate`` lines 68-197, after the defaults of
  pkg/apis/kubeflow.org/v1/pytorch_defaults.go (replicas 1, the ``pytorchjob-port`` 23456, nprocPerNode ``auto``);
- :func:`container_environment` and :func:`expand`: the kubelet (kubernetes/kubernetes
  pkg/kubelet/kubelet_pods.go ``makeEnvironmentVariables``: each variable in order, its value expanded against the
  ones before it, ``valueFrom`` resolved; the command and args expanded against the result), with the expansion of
  third_party/forked/golang/expansion/expand.go (commit fde22c3f9aacfd260225a9741de123a41157b7c0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TRAINER_PORT = 29500
"""Trainer v2.3.0 pkg/constants/constants.go line 72 ``ContainerTrainerPort``."""
PYTORCHJOB_PORT = 23456
"""training-operator v1.9.0 pkg/apis/kubeflow.org/v1/pytorch_types.go ``PyTorchJobDefaultPort``."""
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
"""training-operator v1.9.0 pkg/apis/kubeflow.org/v1/common_types.go line 25; set on every pod by
pkg/controller.v1/common/pod.go ``createNewPod`` (line 404, ``SetReplicaIndex``)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The annotation an Indexed Job's pod carries (JobSet's Jobs are Indexed); Trainer's PET_NODE_RANK reads it
(constants.go line 297, ``JobCompletionIndexFieldPath``)."""

EnvList = list[dict[str, Any]]


def _upsert(env: EnvList, *variables: dict[str, Any]) -> None:
    """Trainer's pkg/apply ``UpsertEnvVars``: a variable of the same name is replaced in place, others appended."""
    for variable in variables:
        names = [e["name"] for e in env]
        if variable["name"] in names:
            env[names.index(variable["name"])] = variable
        else:
            env.append(variable)


def trainjob_env(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> tuple[EnvList, int]:
    """The ``node`` container's env list (before the kubelet resolves it) and the node count, for a TrainJob on a
    runtime with the torch ML policy. PET_NODE_RANK stays a ``fieldRef`` to the completion index, as the controller
    writes it: :func:`pod_metadata` gives each pod its index.

    ``numNodes`` is the TrainJob's, else the runtime's mlPolicy's (lines 116-119); ``numProcPerNode`` the TrainJob's,
    else ``auto``, which becomes the CPU request (else limit) of ``resourcesPerNode`` when it asks for no GPU
    (lines 121-135; runtime.go ``GetNumGPUPerNode``: any resource whose name holds "gpu", requests before limits).
    The trainer's env is upserted first (line 141), then the PET_* variables, then PET_MASTER_ADDR
    ``<name>-node-0-0.<name>`` and PET_MASTER_PORT 29500 (lines 145-176; not for torchtune's command)."""
    trainer = trainjob["spec"].get("trainer", {})
    policy = runtime["spec"]["mlPolicy"]
    assert "torch" in policy, "the runtime has no torch ML policy: the torch plugin does nothing"
    nodes = trainer.get("numNodes", policy.get("numNodes", 1))
    resources = trainer.get("resourcesPerNode") or _runtime_node_resources(runtime)
    gpus = _gpus(resources.get("requests", {})) or _gpus(resources.get("limits", {}))
    procs: int | str = trainer.get("numProcPerNode", "auto")
    if procs == "auto" and gpus == 0:
        procs = max(1, _cpus(resources))
    name = trainjob["metadata"]["name"]
    env: EnvList = []
    _upsert(env, *trainer.get("env", []))
    _upsert(env, {"name": "PET_NNODES", "value": str(nodes)}, {"name": "PET_NPROC_PER_NODE", "value": str(procs)},
            {"name": "PET_NODE_RANK",
             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
    _upsert(env, {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)})
    return env, nodes


def _runtime_node_resources(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """runtime.go ``ExtractResourcePerNodeFromRuntime``: the trainer node container's resources in the runtime."""
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        for container in job["template"]["spec"]["template"]["spec"]["containers"]:
            if job["name"] == "node" and container["name"] == "node":
                return container.get("resources", {})
    return {}


def _gpus(resources: Mapping[str, Any]) -> int:
    return next((int(q) for n, q in resources.items() if "gpu" in n.lower()), 0)


def _cpus(resources: Mapping[str, Any]) -> int:
    """torch.go ``getNumCPUPerNode``: the request, else the limit, as a whole number (Quantity.Value rounds up)."""
    request = resources.get("requests", {}).get("cpu")
    quantity = request if request not in (None, 0, "0") else resources.get("limits", {}).get("cpu", 0)
    text = str(quantity)
    return -(-int(text[:-1]) // 1000) if text.endswith("m") else int(-(-float(text) // 1))


def trainjob_container(trainjob: Mapping[str, Any]) -> dict[str, Any]:
    """The ``node`` container's command and args: the TrainJob's trainer overrides the runtime's."""
    trainer = trainjob["spec"]["trainer"]
    return {"command": list(trainer.get("command", [])), "args": list(trainer.get("args", []))}


def pytorchjob_env(job: Mapping[str, Any], role: str, index: int) -> EnvList:
    """The env list of the ``pytorch`` container of replica ``role`` (Master or Worker) number ``index``.

    setPodEnv: the template's env, then PYTHONUNBUFFERED=1; with a Master replica MASTER_PORT, PET_MASTER_PORT,
    MASTER_ADDR, PET_MASTER_ADDR (``<name>-master-0``, the port of the Master's ``pytorchjob-port``), WORLD_SIZE
    (all replicas × nprocPerNode when a number, else × 1), RANK and PET_NODE_RANK (the index, +1 on a Worker); then
    PET_NPROC_PER_NODE (nprocPerNode, defaulted to ``auto`` unless elasticPolicy.nProcPerNode is set); then the
    elastic variables, or PET_NNODES = all replicas. Elastic: PET_RDZV_ENDPOINT (rdzvHost, else ``<name>-worker-0``;
    rdzvPort, else the Worker's port), PET_RDZV_BACKEND (c10d unless set), PET_NNODES (minReplicas:maxReplicas, both
    defaulted to the Worker replicas, or each to the other), PET_MAX_RESTARTS, PET_NPROC_PER_NODE, PET_RDZV_ID,
    PET_RDZV_CONF (``k=v,...``), PET_STANDALONE="" when standalone is true."""
    spec = job["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    container = next(c for c in replicas[role]["template"]["spec"]["containers"] if c["name"] == "pytorch")
    elastic = spec.get("elasticPolicy")
    nproc = spec.get("nprocPerNode")
    if nproc is None and (elastic is None or elastic.get("nProcPerNode") is None):
        nproc = "auto"  # pytorch_defaults.go setDefaultNprocPerNode
    total = sum(r.get("replicas", 1) for r in replicas.values())
    env: EnvList = [*container.get("env", []), {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if "Master" in replicas:
        port = str(_port(replicas["Master"]))
        address = f"{job['metadata']['name']}-master-0"
        env += [{"name": "MASTER_PORT", "value": port}, {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": address}, {"name": "PET_MASTER_ADDR", "value": address}]
        rank = index + 1 if role == "Worker" else index
        world_size = total * (int(nproc) if str(nproc).isdigit() else 1)
        env += [{"name": "WORLD_SIZE", "value": str(world_size)}, {"name": "RANK", "value": str(rank)},
                {"name": "PET_NODE_RANK", "value": str(rank)}]
    if nproc is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(nproc)})
    if elastic is None:
        env.append({"name": "PET_NNODES", "value": str(total)})
        return env
    workers = replicas["Worker"].get("replicas", 1)
    low = elastic.get("minReplicas", elastic.get("maxReplicas", workers))
    high = elastic.get("maxReplicas", elastic.get("minReplicas", workers))
    host = elastic.get("rdzvHost", f"{job['metadata']['name']}-worker-0")
    env += [{"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{elastic.get('rdzvPort', _port(replicas['Worker']))}"},
            {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
            {"name": "PET_NNODES", "value": f"{low}:{high}"}]
    if "maxRestarts" in elastic:
        env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
    if "nProcPerNode" in elastic:
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(elastic["nProcPerNode"])})
    if "rdzvId" in elastic:
        env.append({"name": "PET_RDZV_ID", "value": elastic["rdzvId"]})
    if elastic.get("rdzvConf") is not None:
        conf = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
        env.append({"name": "PET_RDZV_CONF", "value": conf})
    if elastic.get("standalone"):
        env.append({"name": "PET_STANDALONE", "value": ""})
    return env


def _port(replica: Mapping[str, Any]) -> int:
    """envvar.go ``getPortFromPyTorchJob``: the ``pytorchjob-port`` of the ``pytorch`` container (the default
    webhook adds 23456 when there is none)."""
    for container in replica["template"]["spec"]["containers"]:
        for port in container.get("ports", []) if container["name"] == "pytorch" else []:
            if port.get("name") == "pytorchjob-port":
                return int(port["containerPort"])
    return PYTORCHJOB_PORT


def pod_metadata(name: str, labels: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": "default", "labels": dict(labels or {}), "annotations": dict(annotations or {})}


def container_environment(env: EnvList, pod: Mapping[str, Any],
                          secrets: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The variables the container starts with, as the kubelet's ``makeEnvironmentVariables`` resolves ``env``:
    in order, a ``value`` expanded against the variables before it, a ``fieldRef`` read from the pod's metadata
    (``metadata.name``, ``.namespace``, ``.labels['k']``, ``.annotations['k']``), a ``secretKeyRef`` read from
    ``secrets``, skipped when missing and ``optional``; a name given twice keeps the last value."""
    resolved: dict[str, str] = {}
    for variable in env:
        name, source = variable["name"], variable.get("valueFrom")
        if source is None:
            resolved[name] = expand(variable.get("value", ""), resolved.get)
        elif "fieldRef" in source:
            resolved[name] = _field(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = (secrets or {}).get(ref["name"], {}).get(ref["key"])
            if value is None:
                if not ref.get("optional"):
                    raise LookupError(f"{name}: secret {ref['name']!r} key {ref['key']!r} not found")
                continue
            resolved[name] = value
        else:
            raise NotImplementedError(f"{name}: valueFrom {sorted(source)}")
    return resolved


def _field(pod: Mapping[str, Any], path: str) -> str:
    """pkg/fieldpath ``ExtractFieldPathAsString`` for the metadata paths a pod's env may read."""
    for key in ("labels", "annotations"):
        if path.startswith(f"metadata.{key}['") and path.endswith("']"):
            return pod[key].get(path[len(f"metadata.{key}['"):-2], "")
    if path in ("metadata.name", "metadata.namespace"):
        return pod[path.split(".")[1]]
    raise NotImplementedError(f"fieldRef {path}")


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """expansion.go ``Expand``: ``$(NAME)`` becomes the variable's value, left as written when undefined; ``$$``
    becomes ``$``; a ``$`` before anything else, or an unclosed ``$(``, is kept."""
    out, cursor = [], 0
    while cursor < len(text):
        char = text[cursor]
        if char != "$" or cursor + 1 >= len(text):
            out.append(char)
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "$":
            out.append("$")
            cursor += 2
        elif following == "(" and (close := text.find(")", cursor + 2)) != -1:
            name = text[cursor + 2:close]
            value = lookup(name)
            out.append(f"$({name})" if value is None else value)
            cursor = close + 1
        elif following == "(":
            out.append("$(")
            cursor += 2
        else:
            out.append("$" + following)
            cursor += 2
    return "".join(out)


def container_command(container: Mapping[str, Any], environment: Mapping[str, str]) -> list[str]:
    """The process the container runs: command then args, each expanded against its environment (the kubelet's
    ``ExpandContainerCommandAndArgs``; the image's entrypoint when the manifest gives no command is not modelled)."""
    assert container.get("command"), "a command in the manifest: the image's own entrypoint is not modelled"
    return [expand(word, environment.get) for word in [*container["command"], *container.get("args", [])]]
