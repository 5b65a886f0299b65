"""The Roles for people who run `fsdpmon top`: the least it needs, namespace by namespace."""

from __future__ import annotations

from fsdpmon.manifests.config import ManifestConfig
from fsdpmon.manifests.meta import Obj, common_labels

TOP_ROLE = "fsdpmon-top"


def _role(namespace: str, rules: list[Obj]) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": TOP_ROLE, "namespace": namespace,
                     "labels": common_labels("top", TOP_ROLE)},
        "rules": rules,
    }


def _scrape_pods() -> list[Obj]:
    """Find pods and scrape them through the API server's pod proxy."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]}]


def top_roles(cfg: ManifestConfig) -> list[Obj]:
    """In the job's namespace: scrape the training pods, read their logs, look up the jobs.
    In the monitoring namespace: scrape the exporters. Nothing that writes. Bind with
    `kubectl create rolebinding fsdpmon-top -n NS --role fsdpmon-top --group ml-engineers`."""
    job_rules = [
        *_scrape_pods(),
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "list"]},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
         "verbs": ["get", "list"]},
    ]
    roles = [_role(cfg.namespace, job_rules)]
    if cfg.monitoring_namespace != cfg.namespace:
        roles.append(_role(cfg.monitoring_namespace, _scrape_pods()))
    return roles
