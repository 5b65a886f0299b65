"""kube-prometheus-stack objects: PodMonitor (training), ServiceMonitor (exporters),
PrometheusRule and Grafana dashboard ConfigMaps built from the `dashboards` package."""

from __future__ import annotations

import json
from typing import Any

from fsdpmon import conventions as conv
from fsdpmon.errors import ConfigError
from fsdpmon.manifests import exporter
from fsdpmon.manifests.config import ManifestConfig
from fsdpmon.manifests.meta import Obj, common_labels

TRAINING_MONITOR = "fsdpmon-training"
RULES_NAME = "fsdpmon-rules"
# Group keys every prometheus-operator CRD version accepts; newer ones (query_offset, labels,
# limit, partial_response_strategy) are rejected by older CRDs and by promtool 2.42.
SAFE_GROUP_KEYS = ("name", "interval", "rules")


def _meta(cfg: ManifestConfig, name: str, namespace: str, component: str) -> Obj:
    labels = common_labels(component, name)
    if cfg.release_label:
        labels["release"] = cfg.release_label  # what kube-prometheus-stack selects on
    return {"name": name, "namespace": namespace, "labels": labels}


def _pod_label(label: str) -> str:
    """Prometheus' meta label for a pod label: non-alphanumerics become underscores."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)


def _copy(source: str, target: str) -> Obj:
    # Only when the source is non-empty, so PyTorchJob and TrainJob rules don't clobber each other.
    return {"sourceLabels": [source], "regex": "(.+)", "targetLabel": target,
            "replacement": "$1", "action": "replace"}


def training_relabelings() -> list[Obj]:
    return [
        _copy(_pod_label(conv.PYTORCHJOB_LABEL), conv.JOB_LABEL),
        _copy(_pod_label(conv.JOBSET_NAME_LABEL), conv.JOB_LABEL),
        _copy(_pod_label("training.kubeflow.org/replica-type"), "replica_type"),
        _copy(_pod_label("training.kubeflow.org/replica-index"), "replica_index"),
        _copy(_pod_label("batch.kubernetes.io/job-completion-index"), "node_rank"),
        _copy("__meta_kubernetes_pod_node_name", "node"),
    ]


def training_podmonitor(cfg: ManifestConfig) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _meta(cfg, TRAINING_MONITOR, cfg.namespace, "training-monitor"),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/part-of": "fsdpmon",
                                         "app.kubernetes.io/component": "training"}},
            "namespaceSelector": {"matchNames": [cfg.namespace]},
            "podMetricsEndpoints": [{
                "port": conv.TRAINING_PORT_NAME,
                "path": "/metrics",
                "interval": cfg.scrape_interval,
                # The monitor labels its series job_name itself; honouring it keeps the name
                # instead of renaming it exported_job_name, and `up` gets it from the pod.
                "honorLabels": True,
                "relabelings": training_relabelings(),
            }],
        },
    }


def exporter_servicemonitor(cfg: ManifestConfig) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _meta(cfg, exporter.NAME, cfg.monitoring_namespace, "exporter-monitor"),
        "spec": {
            "selector": {"matchLabels": exporter.selector_labels()},
            "namespaceSelector": {"matchNames": [cfg.monitoring_namespace]},
            "endpoints": [{
                "port": conv.EXPORTER_PORT_NAME,
                "path": "/metrics",
                "interval": f"{exporter.SCRAPE_INTERVAL_S}s",
                "scrapeTimeout": f"{exporter.SCRAPE_INTERVAL_S - 1}s",
                # The exporter sets namespace/pod/container to the GPU's *user* pod; without
                # honorLabels Prometheus would overwrite them with the exporter pod's own.
                "honorLabels": True,
            }],
        },
    }


def safe_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: g[k] for k in SAFE_GROUP_KEYS if k in g} for g in groups]


def prometheus_rule(cfg: ManifestConfig, groups: list[dict[str, Any]]) -> Obj:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta(cfg, RULES_NAME, cfg.monitoring_namespace, "rules"),
        "spec": {"groups": safe_groups(groups)},
    }


def dashboard_configmaps(cfg: ManifestConfig, dashboards: dict[str, dict]) -> list[Obj]:
    """One ConfigMap per dashboard, labelled for the Grafana sidecar to pick up."""
    out = []
    for filename in sorted(dashboards):
        stem = filename.removesuffix(".json").replace("_", "-").lower().removeprefix("fsdpmon-")
        meta = _meta(cfg, f"fsdpmon-dashboard-{stem}", cfg.monitoring_namespace, "dashboard")
        meta["labels"]["grafana_dashboard"] = "1"
        # Compact: `kubectl apply` keeps a copy in an annotation limited to 256 KiB.
        body = json.dumps(dashboards[filename], separators=(",", ":"), sort_keys=True)
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                    "data": {filename: body}})
    return out


def monitoring_objects(cfg: ManifestConfig) -> list[Obj]:
    # Imported here: the dashboards package is only needed for this component.
    from fsdpmon.dashboards import build, rulebase, rules

    try:
        groups = rules.rule_groups(runbook_url=cfg.runbook_url or rulebase.DEFAULT_RUNBOOK_URL)
    except ValueError as exc:
        raise ConfigError("--runbook-url", str(exc)) from None
    return [
        training_podmonitor(cfg),
        exporter_servicemonitor(cfg),
        prometheus_rule(cfg, groups),
        *dashboard_configmaps(cfg, build.all_dashboards()),
    ]
