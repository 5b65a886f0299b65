"""What every generated object shares: the plain-dict type and the recommended labels."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def common_labels(component: str, instance: str) -> dict[str, str]:
    """The app.kubernetes.io labels (Kubernetes' recommended set) on every object and pod."""
    return {
        "app.kubernetes.io/name": f"fsdpmon-{component}",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "fsdpmon",
        "app.kubernetes.io/managed-by": "fsdpmon",
    }
