"""A loopback stand-in for the Kubernetes API server (none can run here): pod lists with label
selectors, the pod proxy, and followed pod logs, speaking the API's JSON and chunked streams,
with switchable failures (403, hanging) so the official client sees what a real server sends."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml


def _selected(labels: dict, selector: str) -> bool:
    terms = [t for t in selector.split(",") if t]
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in terms))


class KubeStandIn:
    def __init__(self) -> None:
        self.pods: list[dict] = []
        self.metrics: dict[str, bytes] = {}  # "namespace/pod:port" -> exposition
        self.logs: dict[str, list[str]] = {}  # "namespace/pod/container" -> lines
        self.jobs: dict[str, dict] = {}  # "group/namespace/plural/name" -> custom resource
        self.forbidden: set[str] = set()  # "list-all", "list-namespaced", "proxy"
        self.hang_s = 0.0  # every request sleeps this long first (API server timeouts)
        self.hang_pods: set[str] = set()  # pod proxy requests to these hang
        self.requests: list[str] = []
        self.stopping = threading.Event()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def kubeconfig(self, path: Path, namespace: str = "ml") -> Path:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin",
                          "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "me", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "me",
                                                         "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": message, "reason": reason,
                                  "code": code})

            def do_GET(self) -> None:
                api.requests.append(self.path)
                if api.hang_s:
                    time.sleep(api.hang_s)
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                segs = [unquote(s) for s in parts.path.strip("/").split("/")]
                if segs[:3] == ["api", "v1", "pods"]:
                    return self._list(None, query, "list-all")
                if segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 5:
                    return self._list(segs[3], query, "list-namespaced")
                if len(segs) >= 7 and segs[6] == "proxy":
                    return self._proxy(segs[3], segs[5])
                if len(segs) == 7 and segs[6] == "log":
                    return self._log(segs[3], segs[5], query)
                if segs[0] == "apis" and len(segs) == 7 and segs[3] == "namespaces":
                    job = api.jobs.get(f"{segs[1]}/{segs[4]}/{segs[5]}/{segs[6]}")
                    if job is not None:
                        return self._json(200, job)
                self._status(404, "NotFound", "the server could not find the requested resource")

            def _list(self, namespace: str | None, query: dict, kind: str) -> None:
                if kind in api.forbidden:
                    where = (f'in the namespace "{namespace}"' if namespace
                             else "at the cluster scope")
                    return self._status(403, "Forbidden", f'pods is forbidden: User "me" cannot '
                                        f'list resource "pods" in API group "" {where}')
                items = [p for p in api.pods
                         if (namespace is None or p["metadata"]["namespace"] == namespace)
                         and _selected(p["metadata"].get("labels", {}),
                                       query.get("labelSelector", ""))]
                self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": "1"}, "items": items})

            def _proxy(self, namespace: str, name_port: str) -> None:
                if "proxy" in api.forbidden:
                    return self._status(403, "Forbidden", "pods/proxy is forbidden")
                if name_port.split(":")[0] in api.hang_pods:
                    time.sleep(5)
                body = api.metrics.get(f"{namespace}/{name_port}")
                if body is None:
                    return self._status(404, "NotFound", f'pods "{name_port}" not found')
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up: expected in tests
                    self.wfile.write(body)

            def _log(self, namespace: str, name: str, query: dict) -> None:
                lines = api.logs.get(f"{namespace}/{name}/{query.get('container', '')}")
                if lines is None:
                    return self._status(404, "NotFound", f'pods "{name}" not found')
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = max(0, len(lines) - int(query.get("tailLines", "100000")))
                deadline = time.monotonic() + 20  # bounded even if nobody closes it
                try:
                    while not api.stopping.is_set() and time.monotonic() < deadline:
                        while sent < len(lines):
                            chunk = (lines[sent] + "\n").encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                            sent += 1
                        if query.get("follow") != "true":
                            break
                        time.sleep(0.05)
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass

        return Handler
