"""Debian's VictoriaMetrics stack, started by a test on loopback: vmagent scrapes and writes to
a single-node victoria-metrics, vmalert evaluates a rule file against it and sends to an
Alertmanager (tests/prometheus_stack.py's, with its webhook).

Each binary runs in its own process group in the test's temp directory, killed on exit, as
prometheus_stack's servers do. Everything is paced at 1 s (scrape, evaluation, both remote-write
flushes); VictoriaMetrics' ``-search.latencyOffset`` is 1 s as well, since its default (30 s)
moves every instant query near "now" 30 s into the past (see docs/alerts.md).
"""

from __future__ import annotations

import contextlib
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_stack import Prometheus, _server, get_json, wait_for
from support import free_port

BINARIES = ("victoria-metrics", "vmagent", "vmalert")
PACE = "1s"


def missing() -> list[str]:
    """The stack's binaries not on PATH (Debian's victoria-metrics package ships all three)."""
    return [name for name in BINARIES if shutil.which(name) is None]


def _ready(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
        return response.status == 200


def _still_running(proc: Any, log: Path) -> None:
    if proc.poll() is not None:
        raise AssertionError(f"{log.stem} exited ({proc.returncode}): {log.read_text()[-2000:]}")


@contextlib.contextmanager
def _started(name: str, args: list[str], workdir: Path) -> Iterator[str]:
    """``name`` with ``args`` on a free port; its base URL once /health answers."""
    port = free_port()
    log = workdir / f"{name}.log"
    command = [shutil.which(name) or name, f"-httpListenAddr=127.0.0.1:{port}",
               "-loggerLevel=WARN", *args]
    with _server(command, log) as proc:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            _still_running(proc, log)
            return _ready(url)

        wait_for(f"{name} ready", ready, timeout=30, every=0.2)
        yield url


def scrape_config(targets: dict[str, str],
                  labels: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """vmagent's scrape config: ``{job: "host:port"}`` every second; ``labels``: a job's
    target labels (what Kubernetes discovery adds: pod, node)."""
    return {
        "global": {"scrape_interval": PACE, "scrape_timeout": PACE},
        "scrape_configs": [{"job_name": job, "honor_labels": True, "static_configs": [
            {"targets": [target], "labels": (labels or {}).get(job, {})}]}
            for job, target in targets.items()],
    }


class Victoria(Prometheus):
    """VictoriaMetrics' Prometheus-compatible API (what ``--prometheus URL`` reads), plus the
    vmalert that evaluates the rules against it."""

    def __init__(self, url: str, vmalert_url: str) -> None:
        super().__init__(url)
        self.vmalert_url = vmalert_url

    def rule_problems(self) -> list[str]:
        """Rules whose last evaluation failed on vmalert (a rule that errors never alerts)."""
        groups = get_json(f"{self.vmalert_url}/api/v1/rules")["data"]["groups"]
        return [f"{r['name']}: {r.get('lastError')}" for g in groups for r in g["rules"]
                if r.get("lastError")]

    def rule_count(self) -> int:
        groups = get_json(f"{self.vmalert_url}/api/v1/rules")["data"]["groups"]
        return sum(len(g["rules"]) for g in groups)


@contextlib.contextmanager
def victoria(workdir: Path, targets: dict[str, str], rule_file: Path, alertmanager_url: str,
             labels: dict[str, dict[str, str]] | None = None) -> Iterator[Victoria]:
    """vmagent -> victoria-metrics -> vmalert (-> ``alertmanager_url``), ready when this yields.

    vmalert also writes its records and alert state back (-remoteWrite.url), as a deployment
    that chains rules must: the culprit rules read the job-level records."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "vmagent.yml"
    config.write_text(yaml.safe_dump(scrape_config(targets, labels)))
    with contextlib.ExitStack() as stack:
        vm = stack.enter_context(_started("victoria-metrics", [
            f"-storageDataPath={workdir / 'vm-data'}", "-retentionPeriod=1d",
            f"-search.latencyOffset={PACE}", "-search.disableCache"], workdir))
        stack.enter_context(_started("vmagent", [
            f"-promscrape.config={config}", f"-remoteWrite.url={vm}/api/v1/write",
            f"-remoteWrite.tmpDataPath={workdir / 'vmagent-data'}",
            f"-remoteWrite.flushInterval={PACE}"], workdir))
        vmalert = stack.enter_context(_started("vmalert", [
            f"-rule={rule_file}", f"-datasource.url={vm}", f"-notifier.url={alertmanager_url}",
            f"-remoteWrite.url={vm}", f"-remoteRead.url={vm}",
            f"-remoteWrite.flushInterval={PACE}", f"-evaluationInterval={PACE}"], workdir))
        yield Victoria(vm, vmalert)

