"""Serving: prometheus_client's threading WSGI server, plus ``/healthz`` and basic auth.

prometheus_client's ``start_http_server`` supports TLS but not basic auth or extra paths, so we
assemble the same parts it uses (``ThreadingWSGIServer``, wsgiref's ``make_server``) around the
metrics WSGI app (``exporters.exposition`` or prometheus_client's ``make_wsgi_app``) with a thin
WSGI wrapper in front. ``/healthz`` is left outside basic auth so
kubelet probes work without credentials; it reveals nothing but liveness.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import bcrypt
from prometheus_client.exposition import ThreadingWSGIServer

from exporters.webconfig import WebConfig
from fsdpmon.errors import ConfigError

Health = Callable[[], tuple[bool, str]]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # a client that connects and stalls (TLS handshake included) is dropped

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the log; errors still surface as metrics."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, caching successes (bcrypt is slow
    by design; the cache key is a SHA-256 of the credentials, never the password itself)."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = users
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:  # spend the same bcrypt time, so timing does not reveal user names
            bcrypt.checkpw(password.encode(), next(iter(self.users.values())))
            return False
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        with self._lock:
            if key in self._verified:
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(key)
        return True


def build_app(metrics: WsgiApp, health: Health, auth: BasicAuth | None) -> WsgiApp:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok, reason = health()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [(reason + "\n").encode()]
        if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="fsdpmon"'),
                                                ("Content-Type", "text/plain; charset=utf-8")])
            return [b"Unauthorized\n"]
        return metrics(environ, start_response)

    return app


@dataclass
class Server:
    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def _bind_error(address: str, port: int, exc: OSError) -> ConfigError:
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError("--listen-address", f"cannot listen on {address!r}: {exc.strerror}")
    return ConfigError("--port", f"cannot listen on {address}:{port}: {exc.strerror or exc}")


def serve(metrics: WsgiApp, address: str, port: int, web: WebConfig, health: Health) -> Server:
    """Start serving in a daemon thread; port 0 picks a free port (see ``Server.port``).

    Bad certificates and unusable addresses or ports raise ConfigError naming the field."""
    context = web.tls.ssl_context() if web.tls is not None else None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    class _Server(ThreadingWSGIServer):
        address_family = family

    auth = BasicAuth(dict(web.users)) if web.users else None
    try:
        httpd = make_server(address, port, build_app(metrics, health, auth), _Server,
                            handler_class=_QuietHandler)
    except OSError as exc:
        raise _bind_error(address, port, exc) from None
    if context is not None:
        # Handshake in the request's own thread (on first read), not in the accept loop, so a
        # client that stalls mid-handshake cannot hold up everyone else's scrape.
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True,
                                           do_handshake_on_connect=False)
    thread = threading.Thread(target=httpd.serve_forever, name="fsdpmon-http", daemon=True)
    thread.start()
    return Server(httpd, thread)
