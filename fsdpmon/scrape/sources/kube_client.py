"""Talking to the Kubernetes API for top: the source's settings, loading the client's
configuration (kubeconfig or in-cluster), telling transient API errors from final ones and
saying each in a few words, and following a pod's log in the background.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

from fsdpmon.errors import ConfigError

BACKOFF_S = 0.5  # the first wait after a failed call or log stream; doubled each time after


@dataclass(frozen=True)
class KubeSourceConfig:
    job: str = ""
    selector: str = ""
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    timeout_s: float = 3.0
    in_cluster: bool | None = None  # None: in-cluster config when no kubeconfig is found
    max_workers: int = 16
    log_tail_lines: int = 200


def load(cfg: KubeSourceConfig) -> tuple[client.Configuration, str, bool]:
    """Client configuration, the namespace to use, and whether we run inside the cluster."""
    conf = client.Configuration()
    try:
        if cfg.in_cluster or (cfg.in_cluster is None and not cfg.kubeconfig and not cfg.context
                              and _in_cluster_available()):
            config.load_incluster_config(client_configuration=conf)
            return conf, cfg.namespace or _incluster_namespace(), True
        config.load_kube_config(config_file=cfg.kubeconfig, context=cfg.context,
                                client_configuration=conf)
        _, active = config.list_kube_config_contexts(config_file=cfg.kubeconfig)
        if cfg.context:
            contexts, _ = config.list_kube_config_contexts(config_file=cfg.kubeconfig)
            active = next(c for c in contexts if c["name"] == cfg.context)
        namespace = cfg.namespace or active.get("context", {}).get("namespace") or "default"
        return conf, namespace, False
    except (ConfigException, OSError, StopIteration, TypeError, ValueError, AttributeError,
            yaml.YAMLError) as exc:
        # A malformed file shows up as a YAML error or, when it parses to something other than a
        # mapping, as a TypeError/AttributeError inside the client's loader: all are bad input.
        field = "--context" if cfg.context and "context" in str(exc).lower() else "--kubeconfig"
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, TypeError | AttributeError):
            detail = f"not a kubeconfig (a YAML mapping of clusters, contexts, users): {detail}"
        raise ConfigError(field, f"cannot load Kubernetes configuration: {detail}") from None


def _in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.path.exists(
        os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config")))


def _incluster_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (429, 500, 502, 503, 504) or exc.status == 0
    return isinstance(exc, (urllib3.exceptions.HTTPError, OSError))


def describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    text = str(exc)
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timed out"
    if "refused" in text.lower():
        return "connection refused"
    return text.split(": ", 1)[-1][:160] or type(exc).__name__


class LogFollower(threading.Thread):
    """Streams one pod container's log (tail, then follow) into a bounded buffer."""

    def __init__(self, open_stream: Callable[[], Any], pod: str, keep: int) -> None:
        super().__init__(name=f"fsdpmon-logs-{pod}", daemon=True)
        self.pod = pod
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._open = open_stream
        self._stop = threading.Event()
        self._response: Any = None

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._response = self._open()
                for line in iter_resp_lines(self._response):
                    if self._stop.is_set():
                        return
                    self.lines.append(line)
                failures = 0  # the stream ended (container restarted): open it again
            except Exception as exc:  # any API or network failure: say so, back off, retry
                failures += 1
                self.lines.append(f"[fsdpmon top: log stream failed: {describe(exc)}]")
            self._stop.wait(min(30.0, BACKOFF_S * 2**failures))

    def stop(self) -> None:
        self._stop.set()
        # Closing the response would wait for the reader thread's blocked read (it holds the
        # buffer's lock); shutting the socket down ends that read at once.
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
