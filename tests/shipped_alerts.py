"""Watch a job with the alerts a platform team would get: Debian's Prometheus loaded with the
shipped rule file exactly as generated (``dashboards/generated/fsdpmon-rules.yaml``: the same
thresholds and the same ``for`` durations), scraping the training endpoint and the exporter at
the shipped manifests' intervals, sending to Alertmanager and a webhook; then read back every
alert that went pending or firing over the run.

A 15m ``for`` cannot fire within a few minutes, so what is counted is every raw ``ALERTS``
sample (Prometheus writes one per rule evaluation for each pending or firing alert), read as a
range vector over the whole life of this Prometheus: nothing can fall between two queries.
Rule evaluation every EVAL_INTERVAL_S, stricter than the operator's default (30 s): a condition
that holds for one evaluation shows as pending. Used by bench_diagnose.py's healthy runs
(benchmarks/healthy_runs.py).
"""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_stack import Prometheus, Webhook, alertmanager, get_json, run_prometheus

from fsdpmon import catalog
from fsdpmon.manifests.config import ManifestConfig
from fsdpmon.manifests.exporter import SCRAPE_INTERVAL_S as EXPORTER_SCRAPE_S

REPO = Path(__file__).resolve().parents[1]
SHIPPED_RULES = REPO / "dashboards" / "generated" / "fsdpmon-rules.yaml"
# the PodMonitor's interval by default (15s)
TRAINING_SCRAPE = ManifestConfig.__dataclass_fields__["scrape_interval"].default
EVAL_INTERVAL_S = EXPORTER_SCRAPE_S
SCORE = catalog.TRAIN_STRAGGLER_SCORE.name


@dataclass(frozen=True)
class AlertSeen:
    """One ALERTS series over the run: its samples' span (unix seconds)."""
    name: str
    state: str
    labels: dict[str, str]
    first: float
    last: float
    samples: int


@dataclass
class Watch:
    prom: Prometheus
    hook: Webhook
    started: float  # unix time Prometheus was ready
    # alertname -> (active value, activeAt, labels) as /api/v1/alerts showed them, newest last
    values: dict[str, list[tuple[str, str, dict[str, str]]]] = field(default_factory=dict)

    def poll_values(self) -> None:
        """Keep the value behind any active alert (ALERTS itself only says 1)."""
        for a in get_json(f"{self.prom.url}/api/v1/alerts")["data"]["alerts"]:
            seen = self.values.setdefault(a["labels"]["alertname"], [])
            entry = (a["value"], a["activeAt"], a["labels"])
            if not seen or seen[-1] != entry:
                seen.append(entry)

    def alerts(self) -> list[AlertSeen]:
        """Every series ALERTS had since this Prometheus started, pending or firing."""
        span = max(1, int(time.time() - self.started) + EVAL_INTERVAL_S)
        out = []
        for series in _range(self.prom, f"ALERTS[{span}s]"):
            labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
            times = [float(t) for t, _ in series["values"]]
            out.append(AlertSeen(labels.pop("alertname"), labels.pop("alertstate"), labels,
                                 min(times), max(times), len(times)))
        return sorted(out, key=lambda a: a.first)

    def rule_problems(self) -> list[str]:
        """Rules whose last evaluation failed (a rule that errors can never alert)."""
        groups = get_json(f"{self.prom.url}/api/v1/rules")["data"]["groups"]
        return [f"{r['name']}: {r.get('lastError')}" for g in groups for r in g["rules"]
                if r.get("health") != "ok"]

    def expressions(self) -> dict[str, str]:
        """Alert name -> its expression, as Prometheus loaded it."""
        groups = get_json(f"{self.prom.url}/api/v1/rules")["data"]["groups"]
        return {r["name"]: " ".join(r["query"].split()) for g in groups for r in g["rules"]
                if r["type"] == "alerting"}

    def rule_count(self) -> tuple[int, int]:
        """(alerting rules, recording rules) loaded."""
        groups = get_json(f"{self.prom.url}/api/v1/rules")["data"]["groups"]
        kinds = [r["type"] for g in groups for r in g["rules"]]
        return kinds.count("alerting"), kinds.count("recording")

    def targets_down(self, since: float) -> dict[str, int]:
        """Per scrape job: scrapes that failed since ``since`` (unix; 0: up all along)."""
        span = max(1, int(time.time() - since))
        return {s["metric"]["job"]: sum(1 for _, v in s["values"] if float(v) == 0)
                for s in _range(self.prom, f"up[{span}s]")}

    def lowest_score(self) -> float | None:
        """The lowest straggler score Prometheus scraped (what FsdpmonRankStraggling reads)."""
        span = max(1, int(time.time() - self.started))
        values = [float(v) for s in _range(self.prom, f"{SCORE}[{span}s]") for _, v in s["values"]]
        return min(values, default=None)


def _range(prom: Prometheus, expr: str) -> list[dict]:
    """A range-vector instant query: every raw sample in the range, with its timestamp."""
    body = get_json(f"{prom.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                    timeout=30)
    if body.get("status") != "success":
        raise ValueError(f"{expr}: {body}")
    return list(body["data"]["result"])


def scrape_config(training: str, exporter: str) -> dict:
    """What the shipped PodMonitor / ServiceMonitor ask of Prometheus, for static targets."""
    return {
        "global": {"evaluation_interval": f"{EVAL_INTERVAL_S}s"},
        "rule_files": [str(SHIPPED_RULES)],
        "scrape_configs": [
            {"job_name": "fsdpmon-train", "scrape_interval": TRAINING_SCRAPE,
             "honor_labels": True, "static_configs": [{"targets": [training]}]},
            {"job_name": "fsdpmon-exporter", "scrape_interval": f"{EXPORTER_SCRAPE_S}s",
             "scrape_timeout": f"{EXPORTER_SCRAPE_S - 1}s", "honor_labels": True,
             "static_configs": [{"targets": [exporter]}]},
        ],
    }


@contextlib.contextmanager
def shipped_alerting(workdir: Path, training: str, exporter: str) -> Iterator[Watch]:
    """Alertmanager (to a webhook) and Prometheus with the shipped rules, ready when this
    yields; ``training`` and ``exporter`` are host:port (they may come up later)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = scrape_config(training, exporter)
    with contextlib.ExitStack() as stack:
        hook = stack.enter_context(Webhook())
        am_url = stack.enter_context(alertmanager(workdir, hook.url))
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [am_url.removeprefix("http://")]}]}]}
        prom = stack.enter_context(run_prometheus(workdir, config))
        yield Watch(prom, hook, time.time())
