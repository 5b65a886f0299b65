"""The Role for people who run `fsdpmon top` against a namespace: the least it needs."""

from __future__ import annotations

from fsdpmon.manifests.config import ManifestConfig
from fsdpmon.manifests.training import Obj, common_labels

TOP_ROLE = "fsdpmon-top"


def top_role(cfg: ManifestConfig) -> Obj:
    """Find the job's pods, scrape them through the API server's pod proxy, read their logs,
    and look up the job objects. Nothing that writes. Bind it with e.g.
    `kubectl create rolebinding fsdpmon-top --role fsdpmon-top --group ml-engineers`."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": TOP_ROLE, "namespace": cfg.namespace,
                     "labels": common_labels("top", TOP_ROLE)},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods/proxy", "pods/log"], "verbs": ["get"]},
            {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
             "verbs": ["get", "list"]},
            {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
             "verbs": ["get", "list"]},
        ],
    }
