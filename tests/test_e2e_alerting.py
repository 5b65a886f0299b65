"""End to end: training + exporter -> real Prometheus -> dashboard queries and the stall alert.

A 2-rank CPU training run (torchrun, the fsdpmon monitor serving on loopback) and the exporter
with 2 simulated GPUs are scraped every second by Debian's Prometheus, which evaluates a fast
variant of the shipped rules (short stall floor, no ``for``) every second and sends alerts to
Debian's Alertmanager, which delivers them to a webhook receiver run by this test.

1. Every query of every dashboard panel, after variable substitution, returns at least one series
   (panels made only of device-only metrics must be empty, and only because a CPU run has no
   device); every variable other than ``namespace`` (no Kubernetes here) has values.
2. A non-serving rank is frozen with SIGSTOP: FsdpmonTrainingStalled fires in Prometheus, reaches
   Alertmanager and is delivered to the webhook; the "Firing alerts" panel now has data.
3. After SIGCONT the alert resolves and the resolved notification is delivered.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil
import pytest
from prometheus_stack import (
    ALERTMANAGER,
    PROMETHEUS,
    Prometheus,
    Webhook,
    alertmanager,
    free_port,
    get_json,
    prometheus,
    wait_for,
)
from trainer_launch import child_env, launched, torchrun_args

from dashboards.build import DEVICE_ONLY, all_dashboards
from dashboards.generate import rules_yaml
from dashboards.panels import expressions, variable_selector
from dashboards.panels import substitute as render
from dashboards.promql import metric_names
from dashboards.rules import RuleBounds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(ALERTMANAGER, os.X_OK)),
                       reason="Debian prometheus/prometheus-alertmanager missing"),
]

JOB_NAME = "e2e-alerting"
NODE = "e2e-alerting-node"
STALL = "FsdpmonTrainingStalled"
# Fast alerting for the test; the shipped defaults (RuleBounds()) suit real jobs.
FAST = RuleBounds(stall_floor_seconds=8, stall_for="0s")
# What Grafana sends with this job and node selected, All ranks and namespaces, a 10m range.
VARIABLES = {"__rate_interval": "15s", "__interval": "2s", "__range": "10m",
             "namespace": ".*", "job": JOB_NAME, "node": NODE, "rank": ".*"}


def substitute(expr: str) -> str:
    return render(expr, VARIABLES)


def training_args(metrics_port: int) -> list[str]:
    return ["-m", "trainer.train", "--model", "tiny", "--max-steps", "100000",
            "--batch-size", "2", "--seq-len", "32", "--log-every", "1", "--warmup-steps", "2",
            "--metrics-port", str(metrics_port), "--job-name", JOB_NAME]


def rank_processes(launcher: subprocess.Popen) -> list[psutil.Process]:
    procs = psutil.Process(launcher.pid).children(recursive=True)
    return [p for p in procs if "trainer.train" in " ".join(p.cmdline())]


def non_serving_rank(launcher: subprocess.Popen, port: int) -> tuple[psutil.Process, str]:
    """A rank process that does not hold the metrics port (stopping it keeps scrapes working)."""
    ranks = rank_processes(launcher)
    assert len(ranks) == 2, ranks
    for proc in ranks:
        connections = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6
        listening = any(c.status == psutil.CONN_LISTEN and c.laddr.port == port
                        for c in connections(kind="tcp"))
        if not listening:
            return proc, proc.environ()["RANK"]
    raise AssertionError("both ranks listen on the metrics port")


# Panels that only show CUDA-device figures: empty on this CPU run (and nothing else may be).
CPU_RUN_EMPTY = {"MFU", "Allocator retries and OOMs"}


def panel_title(where: str) -> str:
    return where.split("'")[1] if "'" in where else where


def check_panels(prom: Prometheus, only_alerts: bool) -> list[str]:
    """Problems with panel queries: empty results that are not explained by a CPU-only run."""
    problems: list[str] = []
    device_only_empty: set[str] = set()
    for name, dash in all_dashboards().items():
        for where, expr in expressions(dash):
            if where.startswith("variable") or ("ALERTS" in metric_names(expr)) != only_alerts:
                continue
            if prom.query(substitute(expr)):
                continue
            names = metric_names(expr)
            device_only = names <= DEVICE_ONLY and not any(
                prom.query(f'count({{__name__="{n}"}})') for n in names)
            if not device_only:
                problems.append(f"{name} {where}: no series for {substitute(expr)}")
            else:
                device_only_empty.add(panel_title(where))
    if not only_alerts and device_only_empty != CPU_RUN_EMPTY:
        problems.append(f"device-only panels empty: {device_only_empty}, not {CPU_RUN_EMPTY}")
    return problems


def check_variables(prom: Prometheus) -> None:
    for dash in all_dashboards().values():
        for var in dash["templating"]["list"]:
            if var["type"] != "query" or var["name"] == "namespace":
                continue  # no Kubernetes namespace on a local run
            selector, label = variable_selector(var["definition"])
            values = prom.label_values(substitute(selector), label)
            expected = {"job": JOB_NAME, "node": NODE, "rank": "1"}[var["name"]]
            assert expected in values, (var["name"], values)


def step_of(prom: Prometheus, rank: str) -> float:
    result = prom.query(f'fsdpmon_train_step{{job_name="{JOB_NAME}", rank="{rank}"}}')
    return float(result[0]["value"][1])


def firing_notifications(hook: Webhook, rank: str, status: str) -> list[dict]:
    return [n for n in hook.received() if n["status"] == status and any(
        a["labels"].get("alertname") == STALL and a["labels"].get("rank") == rank
        and a["status"] == status for a in n["alerts"])]


@pytest.fixture
def stack(tmp_path):
    """Training run, exporter, Alertmanager, Prometheus and the webhook, all on loopback."""
    train_port, exporter_port = free_port(), free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    env = child_env(FSDPMON_LISTEN_ADDRESS="127.0.0.1", FSDPMON_STATE_DIR=str(tmp_path / "st"),
                    FSDPMON_STALL_FLOOR_SECONDS="8", NODE_NAME=NODE)
    exporter = [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(exporter_port),
                "--listen-address", "127.0.0.1", "--interval", "1", "--simulate-gpus", "2",
                "--node-name", NODE]
    with contextlib.ExitStack() as stack:
        trainer = stack.enter_context(launched(torchrun_args(2, training_args(train_port)),
                                               env, tmp_path / "train.log"))
        stack.enter_context(launched(exporter, env, tmp_path / "exporter.log"))
        hook = stack.enter_context(Webhook())
        am_url = stack.enter_context(alertmanager(tmp_path, hook.url))
        prom = stack.enter_context(prometheus(
            tmp_path, {"fsdpmon-train": f"127.0.0.1:{train_port}",
                       "fsdpmon-exporter": f"127.0.0.1:{exporter_port}"}, rules, am_url))
        yield {"trainer": trainer, "port": train_port, "prom": prom, "am": am_url,
               "hook": hook, "logs": tmp_path}


def test_dashboards_and_stall_alert_against_real_prometheus(stack):
    prom, hook, trainer = stack["prom"], stack["hook"], stack["trainer"]
    started = time.monotonic()

    def training_log() -> str:
        return (stack["logs"] / "train.log").read_text()[-3000:]

    # Both targets up, both ranks stepping, job-level figures recorded, rate windows filled.
    wait_for("both targets up", lambda: len(prom.query("up == 1")) == 2, timeout=90)
    wait_for(f"2 ranks past step 5 ({training_log()})",
             lambda: len(prom.query(f'fsdpmon_train_step{{job_name="{JOB_NAME}"}} > 5')) == 2,
             timeout=120)
    wait_for("job figures recorded", lambda: prom.query("fsdpmon_job:eta_seconds:estimate"),
             timeout=30)
    time.sleep(max(0.0, 16 - (time.monotonic() - started)))  # >= one $__rate_interval of data
    assert trainer.poll() is None, training_log()
    assert not prom.alerts(STALL), "stall alert fired on a healthy run"

    problems = check_panels(prom, only_alerts=False)
    assert not problems, "\n".join(problems)
    check_variables(prom)

    frozen, rank = non_serving_rank(trainer, stack["port"])
    frozen.suspend()  # SIGSTOP
    try:
        fired = wait_for("stall alert firing in Prometheus",
                         lambda: [a for a in prom.alerts(STALL) if a["labels"]["rank"] == rank],
                         timeout=60)
        stalled_at = step_of(prom, rank)
        assert fired[0]["labels"]["severity"] == "critical"
        assert fired[0]["labels"]["job_name"] == JOB_NAME
        wait_for("stall alert in Alertmanager", lambda: [
            a for a in get_json(f"{stack['am']}/api/v2/alerts")
            if a["labels"]["alertname"] == STALL and a["labels"]["rank"] == rank], timeout=30)
        note = wait_for("firing notification at the webhook",
                        lambda: firing_notifications(hook, rank, "firing"), timeout=30)[0]
        alert = next(a for a in note["alerts"] if a["labels"]["rank"] == rank)
        assert JOB_NAME in alert["annotations"]["summary"] and alert["annotations"]["hint"]
        problems = check_panels(prom, only_alerts=True)
        assert not problems, "\n".join(problems)
    finally:
        frozen.resume()  # SIGCONT

    wait_for("stall alert resolved in Prometheus",
             lambda: not [a for a in prom.alerts(STALL) if a["labels"]["rank"] == rank],
             timeout=60)
    wait_for("resolved notification at the webhook",
             lambda: firing_notifications(hook, rank, "resolved"), timeout=60)
    assert trainer.poll() is None, "training must still run: the alert resolved by progress"
    assert step_of(prom, rank) > stalled_at, "the frozen rank made progress after SIGCONT"
