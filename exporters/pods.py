"""Pod UID -> namespace/pod/container, from the Kubernetes API, cached, never per scrape.

A background thread lists the pods on this node only (field selector ``spec.nodeName=NODE``)
through the official kubernetes client every ``refresh_s`` seconds, and sooner when the sampler
meets a pod UID it does not know yet (rate-limited), so a new pod gets its labels within a couple
of seconds while a steady node costs one small list per refresh period. Lookups read the last
index under a lock and never touch the network.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdpmon.conventions import JOBSET_NAME_LABEL, PYTORCHJOB_LABEL, TRAINING_PORT_NAME
from fsdpmon.errors import ConfigError
from fsdpmon.exporters.sample import PodRef

log = logging.getLogger(__name__)

MIN_EARLY_REFRESH_S = 2.0
STATIC_POD_HASH = "kubernetes.io/config.hash"


@dataclass(frozen=True)
class PodEntry:
    namespace: str
    name: str
    training: bool
    containers: Mapping[str, str] = field(default_factory=dict)  # container ID -> name


def _strip_runtime(container_id: str) -> str:
    """``containerd://abc`` -> ``abc`` (the form cgroup paths carry)."""
    return container_id.split("://", 1)[-1]


def is_training_pod(pod: Mapping[str, Any]) -> bool:
    """A PyTorchJob/TrainJob pod, or any pod exposing the fsdpmon training port."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if PYTORCHJOB_LABEL in labels or JOBSET_NAME_LABEL in labels:
        return True
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == TRAINING_PORT_NAME:
                return True
    return False


def index_pods(pods: list[Mapping[str, Any]]) -> dict[str, PodEntry]:
    """Pod UID -> entry, from pods as API JSON (camelCase). Malformed pods are skipped."""
    index: dict[str, PodEntry] = {}
    for pod in pods:
        try:
            meta = pod["metadata"]
            status = pod.get("status") or {}
            statuses = (status.get("containerStatuses") or []) + (
                status.get("initContainerStatuses") or []
            )
            containers = {
                _strip_runtime(s["containerID"]): s["name"]
                for s in statuses
                if s.get("containerID") and s.get("name")
            }
            entry = PodEntry(meta["namespace"], meta["name"], is_training_pod(pod), containers)
            index[meta["uid"]] = entry
            # A static pod's cgroups carry the kubelet's UID (the config hash), not its mirror
            # pod's API UID.
            config_hash = (meta.get("annotations") or {}).get(STATIC_POD_HASH)
            if config_hash:
                index.setdefault(config_hash, entry)
        except (KeyError, TypeError, AttributeError):
            log.debug("skipping malformed pod object")
    return index


class PodIndex:
    """The pods of one node, refreshed in the background; ``lookup`` never blocks on the API."""

    def __init__(self, api: Any, node_name: str, refresh_s: float = 15.0,
                 min_early_refresh_s: float = MIN_EARLY_REFRESH_S) -> None:
        self.api = api  # kubernetes.client.CoreV1Api
        self.node_name = node_name
        self.refresh_s = refresh_s
        self.min_early_refresh_s = min_early_refresh_s
        self._index: dict[str, PodEntry] = {}
        self._asked: set[str] = set()  # unknown UIDs that already asked for an early refresh
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_list = 0.0
        self._thread: threading.Thread | None = None
        self.lists = 0  # completed lists (for tests and the benchmark)
        self.errors = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fsdpmon-pods", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def lookup(self, pod_uid: str, container_id: str) -> PodRef | None:
        """The pod labels for a cgroup's pod UID; unknown UIDs ask for an early refresh."""
        with self._lock:
            entry = self._index.get(pod_uid)
            # Each unknown UID asks for one early refresh per period, not one per sample: a
            # process may outlive its pod's API object for a while.
            ask = entry is None and pod_uid not in self._asked
            if ask:
                self._asked.add(pod_uid)
        if ask:
            self._wake.set()
        if entry is None:
            return None
        return PodRef(entry.namespace, entry.name, entry.containers.get(container_id, ""),
                      entry.training)

    def refresh(self) -> None:
        """List this node's pods once and replace the index (raises on API errors)."""
        response = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}",
            _preload_content=False,
            _request_timeout=10,
        )
        try:
            items = json.loads(response.data).get("items") or []
        finally:
            response.release_conn()
        index = index_pods(items if isinstance(items, list) else [])
        with self._lock:
            self._index = index
        self.lists += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._last_list = time.monotonic()
            try:
                self.refresh()
            except Exception as exc:  # the API can fail in many ways; the exporter must not
                self.errors += 1
                log.warning("listing pods on node %s failed: %s", self.node_name, exc)
            woken_early = self._wake.wait(self.refresh_s)
            self._wake.clear()
            if not woken_early:
                with self._lock:
                    self._asked.clear()
            # An unknown UID wakes us early, but never more often than min_early_refresh_s.
            rest = self.min_early_refresh_s - (time.monotonic() - self._last_list)
            if woken_early and rest > 0:
                self._stop.wait(rest)
                self._wake.clear()


def api_from_config(kubeconfig: str | None) -> Any | None:
    """A CoreV1Api from --kubeconfig, or in-cluster config; None outside Kubernetes."""
    from kubernetes import client, config

    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise ConfigError("--kubeconfig", f"no such file: {kubeconfig}")
        try:
            return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        except Exception as exc:
            raise ConfigError("--kubeconfig", f"cannot load {kubeconfig}: {exc}") from None
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            raise ConfigError("--kubeconfig", f"running in a pod but the in-cluster config "
                              f"failed ({exc}); mount a service account token or pass "
                              "--kubeconfig") from None
        return client.CoreV1Api(client.ApiClient(configuration))
    return None
