"""The per-node exporter: DaemonSet on GPU nodes, headless Service, and the RBAC it needs."""

from __future__ import annotations

from fsdpmon import conventions as conv
from fsdpmon.manifests.config import INSTANCE_TYPES, ManifestConfig
from fsdpmon.manifests.meta import Obj, common_labels
from fsdpmon.manifests.training import GPU, INSTANCE_TYPE_LABEL

NAME = conv.EXPORTER_APP_NAME
SCRAPE_INTERVAL_S = 5


def exporter_labels() -> dict[str, str]:
    labels = common_labels("exporter", NAME)
    labels[conv.EXPORTER_APP_LABEL] = conv.EXPORTER_APP_NAME
    return labels


def selector_labels() -> dict[str, str]:
    return {conv.EXPORTER_APP_LABEL: conv.EXPORTER_APP_NAME, "app.kubernetes.io/instance": NAME}


def _meta(cfg: ManifestConfig, name: str = NAME) -> Obj:
    return {"name": name, "namespace": cfg.monitoring_namespace, "labels": exporter_labels()}


def gpu_node_affinity(cfg: ManifestConfig) -> Obj:
    """Schedule on GPU nodes only, however the cluster labels them (terms are ORed)."""
    types = sorted({*INSTANCE_TYPES, *([cfg.instance_type] if cfg.instance_type else [])})
    terms = [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In",
                               "values": ["true"]}]},  # NVIDIA GPU operator / feature discovery
        {"matchExpressions": [{"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt",
                               "values": ["0"]}]},  # Karpenter-provisioned EKS nodes
        {"matchExpressions": [{"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": types}]},
    ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}


def exporter_container(cfg: ManifestConfig) -> Obj:
    return {
        "name": "exporter",
        "image": cfg.exporter_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["fsdpmon"],
        "args": [
            "exporter",
            "--port", str(conv.EXPORTER_PORT),
            "--listen-address", "$(POD_IP)",  # the pod's own IP only, not every interface
            "--interval", str(SCRAPE_INTERVAL_S),
            "--node-name", "$(NODE_NAME)",
        ],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            # The NVIDIA container runtime exposes every GPU for monitoring without allocating
            # any, so the exporter never takes a GPU away from training.
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "ports": [{"name": conv.EXPORTER_PORT_NAME, "containerPort": conv.EXPORTER_PORT,
                   "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": conv.EXPORTER_PORT_NAME},
                           "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": conv.EXPORTER_PORT_NAME},
                          "periodSeconds": 30, "failureThreshold": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "256Mi"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def daemonset(cfg: ManifestConfig) -> Obj:
    pod_spec: Obj = {
        "serviceAccountName": NAME,
        # hostPID: NVML reports GPU processes by host PID, and pod attribution reads
        # /proc/<pid>/cgroup of the training processes; both need the host's PID namespace.
        "hostPID": True,
        "affinity": gpu_node_affinity(cfg),
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
                        {"operator": "Exists", "effect": "NoExecute"}],
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [exporter_container(cfg)],
        # The root filesystem is read-only; Python and libraries may still want a scratch dir.
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(cfg),
        "spec": {
            "selector": {"matchLabels": selector_labels()},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": exporter_labels()}, "spec": pod_spec},
        },
    }


def service(cfg: ManifestConfig) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(cfg),
        "spec": {
            "clusterIP": "None",  # headless: Prometheus scrapes every exporter pod
            "selector": selector_labels(),
            "ports": [{"name": conv.EXPORTER_PORT_NAME, "port": conv.EXPORTER_PORT,
                       "targetPort": conv.EXPORTER_PORT_NAME, "protocol": "TCP"}],
        },
    }


def rbac(cfg: ManifestConfig) -> list[Obj]:
    """Read pods to attribute GPU processes. RBAC cannot restrict by node, so it is cluster-wide
    list/watch; the exporter itself only asks for its own node (fieldSelector spec.nodeName)."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cfg)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NAME, "labels": exporter_labels()},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NAME, "labels": exporter_labels()},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
        "subjects": [{"kind": "ServiceAccount", "name": NAME,
                      "namespace": cfg.monitoring_namespace}],
    }
    return [account, role, binding]


def exporter_objects(cfg: ManifestConfig) -> list[Obj]:
    return [*rbac(cfg), daemonset(cfg), service(cfg)]
