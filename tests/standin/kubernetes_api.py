"""What a Kubernetes API server with strict field validation (``kubectl apply --validate=strict``, the default since
kubectl 1.27) checks when a custom resource is created, without a cluster: the CRD's ``openAPIV3Schema`` (read from
the pinned copies in ../shared/engines), unknown fields refused, plus the create-time rules of the engines that the
OpenAPI part cannot express. Used by tests/launchers/test_kubernetes.py.

The schema is a *structural* schema (apiextensions-apiserver), which differs from plain JSON Schema in what it
does with fields it does not list: the server prunes them, and strict field validation reports each pruned field
as an error (``unknown field "spec.x"``). :func:`strict_json_schema` turns a structural schema into a JSON Schema
that refuses exactly what pruning drops, following kubernetes/kubernetes
``staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go`` (``prune``, commit
10dfa86b6c7b04a6f7bad51e4241863768eb2182):

- an object keeps the fields its ``properties`` name, and any field when it has ``additionalProperties`` (each
  value checked against that schema); every other field is pruned, also from an object with neither (``type:
  object`` alone keeps nothing) → ``additionalProperties: false``;
- ``x-kubernetes-preserve-unknown-fields: true`` keeps fields it does not name (``skipPrune``) → left open;
- ``x-kubernetes-embedded-resource: true``, and the resource's root (``Prune(..., root=true)``), keep ``apiVersion``,
  ``kind`` and ``metadata`` (``metaFields``), which the server decodes as TypeMeta and ObjectMeta
  (``schema/objectmeta/coerce.go``: a ``metav1.ObjectMeta`` decoded strictly) → :data:`OBJECT_META`;
- ``x-kubernetes-int-or-string: true``: an integer or a string, whatever ``type`` says (the CRDs spell it as
  ``anyOf: [{type: integer}, {type: string}]``, kept);
- ``nullable: true``: null is allowed besides the type.

``x-kubernetes-validations`` (CEL) are not evaluated; the two that matter at create time, the TrainJob's name rules,
are checked by :func:`create_time_problems`, which first asserts that the CRD still holds those exact rules. Formats
(``int32``, ``date-time``, quantities' patterns aside) and defaults are not checked either."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

OBJECT_META: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
    },
}
"""The fields of ``metav1.ObjectMeta`` a manifest may write (k8s.io/apimachinery/pkg/apis/meta/v1/types.go; the
server-set ones, uid, resourceVersion, ..., are left out: a manifest never writes them), with their types: a label
or annotation value that is not a string fails to decode."""

DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
"""k8s.io/apimachinery/pkg/util/validation/validation.go ``IsDNS1035Label``: this pattern, at most 63 characters."""
TRAINJOB_NAME_RULES = [
    {"message": "metadata.name must match RFC 1035 DNS label format",
     "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"},
    {"message": "metadata.name must be no more than 63 characters", "rule": "size(self.metadata.name) <= 63"},
]
"""The TrainJob CRD's own CEL rules on the name (kubeflow/trainer v2.3.0 pkg/apis/trainer/v1alpha1/trainjob_types.go
lines 36-37): the pods' and the headless Service's names are built from it."""
TORCHRUN_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
"""kubeflow/trainer v2.3.0 pkg/constants/constants.go line 300 ``TorchRunReservedEnvNames``: the torch plugin's
webhook refuses them in ``spec.trainer.env`` (pkg/runtime/framework/plugins/torch/torch.go lines 65-77)."""


def crd_schema(path: Path) -> tuple[dict[str, Any], str, str]:
    """The ``openAPIV3Schema`` of the CRD's one served version, its apiVersion (group/version) and kind."""
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    api_version = f"{crd['spec']['group']}/{version['name']}"
    return version["schema"]["openAPIV3Schema"], api_version, crd["spec"]["names"]["kind"]


def strict_json_schema(structural: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    """The resource's structural schema as a JSON Schema that refuses what the server's pruning would drop (see
    the module's docstring), its root's apiVersion and kind fixed to the CRD's."""
    schema = _strict(copy.deepcopy(structural), root=True)
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return schema


def _strict(node: dict[str, Any], root: bool = False) -> dict[str, Any]:
    node.pop("x-kubernetes-validations", None)  # CEL: not evaluated here
    node["properties"] = {name: _strict(child) for name, child in node.get("properties", {}).items()}
    if not node["properties"]:
        del node["properties"]
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _strict(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = _strict(node["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            node[key] = [_strict(child) for child in node[key]]
    if node.get("nullable") and "type" in node:
        node["type"] = [node["type"], "null"]
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        node.pop("type", None)
        node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if root or node.get("x-kubernetes-embedded-resource"):
        node.setdefault("properties", {})
        node["properties"]["apiVersion"] = {"type": "string"}
        node["properties"]["kind"] = {"type": "string"}
        node["properties"]["metadata"] = copy.deepcopy(OBJECT_META)
    is_object = node.get("type") in ("object", ["object", "null"]) or "properties" in node
    if is_object and not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
        node["additionalProperties"] = False
    return node


def schema_problems(manifest: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """Each way ``manifest`` fails ``schema``, one line naming the field's path as kubectl does (``spec.x[0].y``)."""
    validator = jsonschema.Draft202012Validator(schema)
    return sorted(line for error in validator.iter_errors(manifest) for line in _lines(error))


def _lines(error: jsonschema.ValidationError) -> Iterator[str]:
    if error.validator == "anyOf" and error.context:  # int-or-string and friends: the clearest branch's reason
        yield from _lines(jsonschema.exceptions.best_match(error.context))
        return
    where = _path(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = error.schema.get("properties", {})
        for name in sorted(set(error.instance) - set(known)):
            yield f'unknown field "{_path([*error.absolute_path, name])}"'
        return
    yield f"{where or '(root)'}: {error.message}"


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def create_time_problems(manifest: dict[str, Any], crd_root: dict[str, Any]) -> list[str]:
    """The rules a create request meets after the schema, each failure a line naming the field:

    - TrainJob (kubeflow/trainer v2.3.0): the CRD's CEL rules on ``metadata.name`` (:data:`TRAINJOB_NAME_RULES`,
      asserted to be the CRD's own), and the torch plugin's webhook refusing PET_* names in ``spec.trainer.env``;
    - PyTorchJob (kubeflow/training-operator v1.9.0, pkg/webhooks/pytorch/pytorchjob_webhook.go lines 76-161,
      commit 6f74c7f6b2ed6c27aabd82d0a316b23f0646059c): the name a DNS-1035 label (``NameIsDNS1035Label``);
      replica types Master and Worker only, a Worker with an elasticPolicy; every container with an image and one
      named ``pytorch``; one Master replica, at least one Worker."""
    name = manifest.get("metadata", {}).get("name", "")
    problems = []
    if manifest.get("kind") == "TrainJob":
        assert crd_root.get("x-kubernetes-validations") == TRAINJOB_NAME_RULES, "the TrainJob CRD's name rules changed"
        if not DNS_1035_LABEL.fullmatch(name):
            problems.append(f"metadata.name: {name!r}: {TRAINJOB_NAME_RULES[0]['message']}")
        if len(name) > 63:
            problems.append(f"metadata.name: {TRAINJOB_NAME_RULES[1]['message']} ({len(name)})")
        names = {variable.get("name") for variable in manifest["spec"].get("trainer", {}).get("env", [])}
        reserved = sorted(names & TORCHRUN_RESERVED)
        if reserved:
            problems.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}")
    elif manifest.get("kind") == "PyTorchJob":
        if not DNS_1035_LABEL.fullmatch(name) or len(name) > 63:
            problems.append(f"metadata.name: {name!r} should match: a lowercase RFC 1035 label of at most 63 "
                            "characters ('[a-z]([-a-z0-9]*[a-z0-9])?')")
        spec = manifest["spec"]
        replicas = spec.get("pytorchReplicaSpecs", {})
        if spec.get("elasticPolicy") is not None and "Worker" not in replicas:
            problems.append("spec.pytorchReplicaSpecs[Worker]: must be configured if elastic policy is used")
        for role, replica in replicas.items():
            where = f"spec.pytorchReplicaSpecs[{role}]"
            if role not in ("Master", "Worker"):
                problems.append(f"{where}: Unsupported value: {role!r}: supported values: \"Master\", \"Worker\"")
            containers = (replica or {}).get("template", {}).get("spec", {}).get("containers", [])
            for index, container in enumerate(containers):
                if not container.get("image"):
                    problems.append(f"{where}.template.spec.containers[{index}].image: Required value: must be "
                                    "required")
            if not any(container.get("name") == "pytorch" for container in containers):
                problems.append(f"{where}.template.spec.containers: Required value: must have at least one "
                                "container with name pytorch")
            count = (replica or {}).get("replicas")
            if role == "Master" and count != 1:
                problems.append(f"{where}.replicas: Forbidden: must be 1")
            elif role != "Master" and count is not None and count < 1:
                problems.append(f"{where}.replicas: Forbidden: must be at least 1")
    return problems
