"""Offline validation of generated Kubernetes objects (a test helper, not a test module).

- Core kinds: `kubernetes_validate` in strict mode (unknown fields are errors).
- Custom resources: the upstream CRDs' openAPIV3Schema (tests/data/crds, unmodified) with
  `jsonschema`, made strict: every object schema that lists properties and does not set
  `x-kubernetes-preserve-unknown-fields` gets `additionalProperties: false`, as the API server's
  pruning would silently drop such fields.
- Pod templates embedded in custom resources are also checked as core `PodTemplate`s.
- What neither can express: the PyTorchJob admission webhook's rules.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

CRD_DIR = Path(__file__).resolve().parent / "data" / "crds"
K8S_VERSION = "1.33.0"  # a version EKS supports
CORE_GROUPS = ("v1", "apps/v1", "rbac.authorization.k8s.io/v1")
# libyaml's safe loader where PyYAML was built with it: the CRDs are 4 MB of YAML, 6.2 s to
# read in pure Python on the 2-core VM and 0.36 s with libyaml (the same documents).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict JSON schema, for every CRD file."""
    out = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=SAFE_LOADER):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schema = strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                out[(f"{group}/{version['name']}", kind)] = schema
    if not out:
        raise FileNotFoundError(f"no CustomResourceDefinition files in {CRD_DIR}")
    return out


def strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for item in schema:
            strict(item)
    return schema


class CelRuleError(ValueError):
    """A CRD's x-kubernetes-validations rule on the object's name is violated."""


def check_name_rules(schema: dict[str, Any], obj: dict[str, Any]) -> None:
    """Evaluate the CEL rules at the CRD's root that constrain metadata.name (TrainJob: RFC 1035
    label, at most 63 characters). Other CEL rules concern fields fsdpmon does not set."""
    name = obj["metadata"]["name"]
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        if m := re.fullmatch(r"self\.metadata\.name\.matches\('(.+)'\)", text):
            ok = re.search(m.group(1), name) is not None
        elif m := re.fullmatch(r"size\(self\.metadata\.name\) <= (\d+)", text):
            ok = len(name) <= int(m.group(1))
        else:
            continue
        if not ok:
            raise CelRuleError(f"{obj['kind']} {name!r}: {rule['message']}")


def validate_custom(obj: dict[str, Any]) -> None:
    schema = crd_schemas()[(obj["apiVersion"], obj["kind"])]
    jsonschema.Draft7Validator(schema).validate(obj)
    check_name_rules(schema, obj)
    # The CRD schemas say only `metadata: {type: object}`; check it as a core ObjectMeta.
    validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})


def validate_core(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def validate_object(obj: dict[str, Any]) -> None:
    if obj["apiVersion"] in CORE_GROUPS:
        validate_core(obj)
        return
    validate_custom(obj)
    for template in pod_templates(obj):
        validate_core({"apiVersion": "v1", "kind": "PodTemplate",
                       "metadata": {"name": "check"}, "template": template})


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Full pod templates embedded in a custom resource (TrainJob patches are partial)."""
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "TrainingRuntime":
        return [j["template"]["spec"]["template"]
                for j in obj["spec"]["template"]["spec"]["replicatedJobs"]]
    return []


def pytorchjob_admission_errors(job: dict[str, Any]) -> list[str]:
    """The training operator's webhook rules (v1.9) that the CRD schema cannot express."""
    errors = []
    replicas = job["spec"]["pytorchReplicaSpecs"]
    unknown = set(replicas) - {"Master", "Worker"}
    if unknown:
        errors.append(f"replica types {sorted(unknown)} not allowed")
    if replicas.get("Master", {}).get("replicas") != 1:
        errors.append("there must be exactly one Master replica")
    for rtype, spec in replicas.items():
        containers = spec["template"]["spec"]["containers"]
        if not any(c.get("name") == "pytorch" for c in containers):
            errors.append(f"{rtype}: no container named pytorch")
        errors += [f"{rtype}/{c.get('name')}: no image" for c in containers if not c.get("image")]
    elastic = job["spec"].get("elasticPolicy")
    if elastic and elastic.get("nProcPerNode") and job["spec"].get("nprocPerNode"):
        errors.append("nprocPerNode set twice (spec and elasticPolicy)")
    return errors
