"""One HTTP endpoint per pod: every local rank competes for the port; the holder serves them all.

Local rank 0 tries first; the others retry every few seconds, so when the serving rank exits
(or dies) another takes the port over. Serving runs on prometheus_client's own threaded server,
never on the training thread, so scrapes are answered while training is blocked.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from fsdpmon.monitor.collector import JobStateCollector

log = logging.getLogger(__name__)


class PortKeeper:
    def __init__(self, directory: Path, address: str, port: int, first_try_delay: float,
                 retry_seconds: float) -> None:
        self.address = address
        self.port = port
        self.retry_seconds = retry_seconds
        self.first_try_delay = first_try_delay
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobStateCollector(directory))
        self._server: Any = None
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
            server, _thread = start_http_server(self.port, self.address, registry=self.registry)
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
        log.info("fsdpmon: serving training metrics on http://%s:%d/metrics",
                 self.address, self.port)
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


def _shutdown(server: Any) -> None:
    with contextlib.suppress(Exception):
        server.shutdown()
        server.server_close()
