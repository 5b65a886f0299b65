"""One HTTP endpoint per pod: every local rank competes for the port; the holder serves them all.

Local rank 0 tries first; the others retry every few seconds, so when the serving rank exits
(or dies) another takes the port over. Serving runs in the shared server's worker threads
(``fsdpmon.httpserve``), never on the training thread, so scrapes are answered while training is
blocked. What scrapers can take from training is bounded whatever they do: the exposition is
rendered at most once per ``RENDER_SECONDS`` and the cached bytes served in between, a small pool
of workers serves at most ``max_per_second`` requests, and further clients wait in the kernel's
listen backlog. The same web-config file as the exporter's adds TLS and basic auth.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from fsdpmon.basicauth import BasicAuth
from fsdpmon.families import restrict
from fsdpmon.httpserve import Server, StartResponse, WsgiApp, bind, build_app
from fsdpmon.monitor.collector import JobStateCollector
from fsdpmon.webconfig import WebConfig

log = logging.getLogger(__name__)

RENDER_SECONDS = 1.0  # newest data at most this old; Prometheus scrapes every 15-30 s
WORKERS = 2


class CachedExposition:
    """The registry's exposition, rendered at most once per ``max_age`` seconds per format, and
    again whenever ``version()`` changes (the state directory's mtime: a rank joined, left or
    published its log step), so what ranks publish shows at once while heartbeats and a dead
    rank's disappearance may be up to ``max_age`` old."""

    def __init__(self, registry: CollectorRegistry, max_age: float = RENDER_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 version: Callable[[], object] = lambda: None) -> None:
        self.registry, self.max_age, self.clock, self.version = registry, max_age, clock, version
        self.renders = 0
        self._cache: dict[str, tuple[float, object, bytes]] = {}
        self._lock = threading.Lock()

    def body(self, accept: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        with self._lock:  # concurrent scrapes wait for one render instead of each rendering
            rendered_at, seen, data = self._cache.get(content_type, (None, None, b""))
            now, version = self.clock(), self.version()
            if rendered_at is None or now - rendered_at >= self.max_age or version != seen:
                data = encoder(self.registry)
                self.renders += 1
                self._cache[content_type] = (now, version, data)
        return data, content_type

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        data, content_type = self.body(environ.get("HTTP_ACCEPT", ""))
        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        if names:  # Prometheus's filter, as prometheus_client's handler answers it
            data = restrict(data, set(names))
        start_response("200 OK", [("Content-Type", content_type),
                                  ("Content-Length", str(len(data)))])
        return [data]


class PortKeeper:
    def __init__(self, directory: Path, address: str, port: int, first_try_delay: float,
                 retry_seconds: float, web: WebConfig | None = None,
                 max_per_second: float | None = None,
                 routes: dict[str, WsgiApp] | None = None) -> None:
        self.address = address
        self.port = port
        self.retry_seconds = retry_seconds
        self.first_try_delay = first_try_delay
        self.web = web or WebConfig()
        self.max_per_second = max_per_second
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobStateCollector(directory))
        self.exposition = CachedExposition(self.registry, version=lambda: _mtime(directory))
        auth = BasicAuth(dict(self.web.users)) if self.web.users else None
        self.app = build_app({"/metrics": self.exposition, **(routes or {})}, self.exposition,
                             lambda: (True, "ok"), auth)
        self._server: Server | None = None
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="fsdpmon-port", daemon=True)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.first_try_delay):
            return
        while not self._stop.is_set():
            if self._try_bind():
                return
            self._stop.wait(self.retry_seconds)

    def _try_bind(self) -> bool:
        try:
            server = bind(self.app, self.address, self.port, self.web, workers=WORKERS,
                          max_per_second=self.max_per_second)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.info("fsdpmon: port %s:%d not available (%s); another rank or process holds "
                         "it, retrying every %.0fs", self.address, self.port, exc,
                         self.retry_seconds)
            return False
        if self._stop.is_set():  # closed while binding
            _shutdown(server)
            return True
        self._server = server
        scheme = "https" if self.web.tls is not None else "http"
        log.info("fsdpmon: serving training metrics on %s://%s:%d/metrics",
                 scheme, self.address, self.port)
        return True

    def close(self) -> None:
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            _shutdown(server)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._server is not None:  # a bind that finished while we were closing
            _shutdown(self._server)
            self._server = None


def _mtime(directory: Path) -> int | None:
    try:
        return directory.stat().st_mtime_ns
    except OSError:
        return None


def _shutdown(server: Server) -> None:
    with contextlib.suppress(Exception):
        server.stop()
