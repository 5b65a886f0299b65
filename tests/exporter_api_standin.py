"""A local stand-in for the Kubernetes API's pod list, for the exporter's pod attribution tests.

No API server can run here; this one serves GET /api/v1/pods as PodList JSON (what the official
client reads), or a Status error, and records each request (path, query, Authorization).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

UID = "5b9c2e3f-1d2a-4c6b-9e8f-0a1b2c3d4e5f"
CID = "a" * 64


def pod(uid: str, name: str, labels: dict[str, str] | None = None, ports: list | None = None,
        containers: tuple[tuple[str, str], ...] = (("trainer", CID),)) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"uid": uid, "name": name, "namespace": "ml", "labels": labels or {}},
        "spec": {"nodeName": "node-a",
                 "containers": [{"name": n, "ports": ports or []} for n, _ in containers]},
        "status": {"containerStatuses": [
            {"name": n, "containerID": f"containerd://{c}"} for n, c in containers]},
    }


class FakeApi:
    """Serves GET /api/v1/pods like the API server (PodList JSON), recording requests."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.status = 200
        self.requests: list[dict[str, Any]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                api.requests.append({"path": url.path, "query": parse_qs(url.query),
                                     "auth": self.headers.get("Authorization")})
                if api.status != 200:
                    body = json.dumps({"kind": "Status", "status": "Failure",
                                       "reason": "Forbidden", "code": api.status}).encode()
                else:
                    body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                       "metadata": {"resourceVersion": "1"},
                                       "items": api.pods}).encode()
                self.send_response(api.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()



def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "s3cret-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))
    return path
