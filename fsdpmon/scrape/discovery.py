"""Pure pod selection for the Kubernetes source (and the manifest tests that check it).

Pods are Kubernetes API JSON dicts (camelCase, as `kubectl get pod -o json` or
``ApiClient().sanitize_for_serialization(v1pod)`` gives them). Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fsdpmon.conventions import (
    EXPORTER_APP_LABEL,
    EXPORTER_APP_NAME,
    EXPORTER_PORT_NAME,
    JOBSET_NAME_LABEL,
    JOBSET_REPLICATED_JOB_LABEL,
    PYTORCHJOB_LABEL,
    TRAINING_PORT_NAME,
    TRAINJOB_REPLICATED_JOB,
)

Pod = dict[str, Any]


def label_selectors_for_job(job_name: str) -> list[str]:
    """Selectors that find a job's training pods: PyTorchJob first, then TrainJob (JobSet)."""
    return [
        f"{PYTORCHJOB_LABEL}={job_name}",
        f"{JOBSET_NAME_LABEL}={job_name},{JOBSET_REPLICATED_JOB_LABEL}={TRAINJOB_REPLICATED_JOB}",
    ]


def _labels(pod: Pod) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _matches(labels: dict[str, str], selector: str) -> bool:
    """Equality-based selectors only (``k=v,k2=v2``), which is all the job selectors use."""
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def find_job_pods(pods: list[Pod], job_name: str) -> list[Pod]:
    """The job's training pods among ``pods``, sorted by name (PyTorchJob or TrainJob labels)."""
    selectors = label_selectors_for_job(job_name)
    found = [p for p in pods if any(_matches(_labels(p), s) for s in selectors)]
    return sorted(found, key=pod_name)


def job_names(pods: Iterable[Pod]) -> list[str]:
    """Names of the training jobs whose pods are among ``pods`` (for "job not found" hints)."""
    names = set()
    for pod in pods:
        labels = _labels(pod)
        if PYTORCHJOB_LABEL in labels:
            names.add(labels[PYTORCHJOB_LABEL])
        elif labels.get(JOBSET_REPLICATED_JOB_LABEL) == TRAINJOB_REPLICATED_JOB:
            names.add(labels.get(JOBSET_NAME_LABEL, ""))
    return sorted(n for n in names if n)


def _named_port(pod: Pod, name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and isinstance(port.get("containerPort"), int):
                return port["containerPort"]
    return None


def training_metrics_port(pod: Pod) -> int | None:
    """The container port named ``fsdpmon-train``, if the pod has one."""
    return _named_port(pod, TRAINING_PORT_NAME)


def exporter_metrics_port(pod: Pod) -> int | None:
    """The container port named ``fsdpmon-node``, if the pod has one."""
    return _named_port(pod, EXPORTER_PORT_NAME)


def is_exporter_pod(pod: Pod) -> bool:
    return _labels(pod).get(EXPORTER_APP_LABEL) == EXPORTER_APP_NAME


def training_container(pod: Pod) -> str:
    """The container whose log is the training log: the one serving metrics, else the first."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        if any(p.get("name") == TRAINING_PORT_NAME for p in container.get("ports") or []):
            return str(container.get("name", ""))
    return str(containers[0].get("name", "")) if containers else ""


def pod_name(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def pod_node(pod: Pod) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_ip(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("podIP") or "")


def is_running(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def exporters_for_nodes(pods: Iterable[Pod], nodes: Iterable[str]) -> list[Pod]:
    """Exporter pods running on the given nodes, one per node (the first by name)."""
    wanted = set(nodes)
    chosen: dict[str, Pod] = {}
    for pod in sorted(pods, key=pod_name):
        node = pod_node(pod)
        if is_exporter_pod(pod) and node in wanted and node not in chosen:
            chosen[node] = pod
    return [chosen[n] for n in sorted(chosen)]
