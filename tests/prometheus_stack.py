"""Debian's Prometheus and Alertmanager, started by a test on loopback, plus a webhook receiver.

``run_prometheus`` is the one way tests start a Prometheus. Everything binds 127.0.0.1 on
free ephemeral ports and lives in the test's temp directory; each server runs in its own
process group, killed on exit. The webhook receiver is the test's own
endpoint for Alertmanager notifications (a plain ``http.server``), not a metrics server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from support import free_port

PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """Poll ``check`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except (OSError, ValueError, KeyError) as exc:  # not up yet
            last_error = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} ({last_error})")


@contextlib.contextmanager
def _server(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


class Webhook:
    """Collects Alertmanager webhook notifications (JSON bodies) in arrival order."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with received._lock:
                    received.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Webhook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def received(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.notifications)


@contextlib.contextmanager
def alertmanager(workdir: Path, webhook_url: str,
                 config: dict[str, Any] | None = None) -> Iterator[str]:
    """Alertmanager with ``config`` (default: one webhook receiver, grouping by alert and job,
    1 s group timers)."""
    port = free_port()
    config = config or {
        "route": {"receiver": "test", "group_by": ["alertname", "job_name"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test",
                       "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
    path = workdir / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    args = [ALERTMANAGER, f"--config.file={path}", f"--storage.path={workdir / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    with _server(args, workdir / "alertmanager.log"):
        url = f"http://127.0.0.1:{port}"
        wait_for("Alertmanager ready", lambda: get_json(f"{url}/api/v2/status"), timeout=30)
        yield url


@dataclass
class Prometheus:
    url: str
    pid: int = 0  # its process (a benchmark reads its CPU time)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (ValueError on a query error)."""
        params = urllib.parse.urlencode({"query": expr})
        body = get_json(f"{self.url}/api/v1/query?{params}")
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body}")
        return list(body["data"]["result"])

    def first_time(self, expr: str, start: float, end: float) -> float | None:
        """The earliest evaluation (1 s apart, unix seconds) in [start, end] at which ``expr``
        has a series, or None."""
        params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}",
                                         "end": f"{end:.3f}", "step": "1"})
        body = get_json(f"{self.url}/api/v1/query_range?{params}")
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body}")
        times = [float(t) for series in body["data"]["result"] for t, _ in series["values"]]
        return min(times, default=None)

    def label_values(self, selector: str, label: str) -> set[str]:
        params = urllib.parse.urlencode({"match[]": selector})
        body = get_json(f"{self.url}/api/v1/series?{params}")
        return {s[label] for s in body["data"] if s.get(label)}

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        body = get_json(f"{self.url}/api/v1/alerts")
        return [a for a in body["data"]["alerts"]
                if a["labels"].get("alertname") == name and a["state"] == state]


@contextlib.contextmanager
def run_prometheus(workdir: Path, config: dict[str, Any], *, tsdb: Path | None = None,
                   args: Sequence[str] = (), await_targets: bool = False,
                   timeout: float = 60) -> Iterator[Prometheus]:
    """Prometheus with ``config`` on a free loopback port, ready when this yields.

    ``tsdb`` defaults to a fresh directory in ``workdir``; a test may pass a backfilled one.
    With ``await_targets`` it also waits until every configured target has been scraped once:
    Prometheus applies new targets only every 5 s after start, so a short run could otherwise
    end before its first scrape.
    """
    port = free_port()
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    log = workdir / "prometheus.log"
    command = [PROMETHEUS, f"--config.file={path}",
               f"--storage.tsdb.path={tsdb or workdir / 'prom-data'}",
               f"--web.listen-address=127.0.0.1:{port}", *args]
    with _server(command, log) as proc:
        prom = Prometheus(f"http://127.0.0.1:{port}", proc.pid)

        def ready() -> bool:
            _still_running(proc, log)
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as response:
                return response.status == 200

        deadline = time.monotonic() + timeout
        wait_for("Prometheus ready", ready, timeout=timeout, every=0.3)
        if await_targets:
            expected = _target_count(config)

            def all_tried() -> bool:
                _still_running(proc, log)
                return _targets_tried(prom) == expected

            wait_for(f"Prometheus to try all {expected} targets", all_tried,
                     timeout=max(1.0, deadline - time.monotonic()), every=0.3)
        yield prom


def _still_running(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"prometheus exited ({proc.returncode}): {log.read_text()[-2000:]}")


def _target_count(config: dict[str, Any]) -> int:
    return sum(len(static["targets"]) for job in config.get("scrape_configs", [])
               for static in job.get("static_configs", []))


def _targets_tried(prom: Prometheus) -> int:
    targets = get_json(f"{prom.url}/api/v1/targets")["data"]["activeTargets"]
    return sum(1 for t in targets if not t["lastScrape"].startswith("0001-"))


@contextlib.contextmanager
def prometheus(workdir: Path, targets: dict[str, str], rule_file: Path,
               alertmanager_url: str,
               labels: dict[str, dict[str, str]] | None = None,
               await_targets: bool = False) -> Iterator[Prometheus]:
    """Prometheus scraping ``{job: "host:port"}`` every second, evaluating rules every second;
    ``labels``: a job's target labels (what Kubernetes discovery adds: pod, node);
    ``await_targets``: see run_prometheus."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "rule_files": [str(rule_file)],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [alertmanager_url.removeprefix("http://")]}]}]},
        "scrape_configs": [{"job_name": job, "static_configs": [
            {"targets": [target], "labels": (labels or {}).get(job, {})}]}
            for job, target in targets.items()],
    }
    with run_prometheus(workdir, config, args=["--rules.alert.resend-delay=1s"],
                        await_targets=await_targets) as prom:
        yield prom
