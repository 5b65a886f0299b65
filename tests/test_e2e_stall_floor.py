"""Lowering FSDPMON_STALL_FLOOR_SECONDS pages a hang sooner, through a real Prometheus.

Two one-rank jobs run the real monitor (tests/stall_floor_job.py) with different stall floors,
scraped every second by Debian's Prometheus, which evaluates the shipped rules (only the stall
alert's ``for`` dropped, as in test_e2e_alerting). Both hang at the same moment: the rules hold
no stall bound of their own, so the job whose floor is lower pages first, each no sooner than
its own floor after the hang.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_stack import ALERTMANAGER, PROMETHEUS, Prometheus, prometheus, wait_for
from support import free_port

from fsdpmon import catalog
from fsdpmon.dashboards.generate import rules_yaml
from fsdpmon.dashboards.rulebase import RuleBounds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not (os.access(PROMETHEUS, os.X_OK) and os.access(ALERTMANAGER, os.X_OK)),
                       reason="Debian prometheus/prometheus-alertmanager missing"),
]

REPO = Path(__file__).resolve().parents[1]
LOW, HIGH = 3.0, 9.0  # stall floors (s): the low one's page must come well before the high's
STALL = "FsdpmonTrainingStalled"


def job(name: str, floor: float, port: int, tmp: Path) -> subprocess.Popen:
    env = {**os.environ, "FSDPMON_PORT": str(port), "FSDPMON_JOB_NAME": name,
           "FSDPMON_LISTEN_ADDRESS": "127.0.0.1", "FSDPMON_STATE_DIR": str(tmp / name),
           "FSDPMON_STALL_FLOOR_SECONDS": f"{floor:g}", "FSDPMON_LOG_INTERVAL": "5",
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    env.pop("FSDPMON_FAULT", None)
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "stall_floor_job.py"),
                             str(tmp / "hang")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def bounds(prom: Prometheus) -> dict[str, float]:
    """job -> the stall bound its rank publishes, once it has stepped."""
    expr = f"{catalog.TRAIN_STALL_THRESHOLD_SECONDS.name} and {catalog.TRAIN_STEP.name} > 0"
    return {r["metric"]["job_name"]: float(r["value"][1]) for r in prom.query(expr)}


def paged(prom: Prometheus, job_name: str) -> float | None:
    """When the job's stall alert went active (with no ``for``: when it fired), unix seconds."""
    for alert in prom.alerts(STALL):
        if alert["labels"]["job_name"] == job_name:
            stamp = re.sub(r"(\.\d{6})\d+", r"\1", alert["activeAt"]).replace("Z", "+00:00")
            return datetime.fromisoformat(stamp).timestamp()
    return None


def test_a_lower_stall_floor_pages_a_hang_sooner(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(RuleBounds(stall_for="0s")))
    ports = {"low": free_port(), "high": free_port()}
    procs = [job(name, floor, ports[name], tmp_path)
             for name, floor in (("low", LOW), ("high", HIGH))]
    try:
        targets = {f"train-{name}": f"127.0.0.1:{port}" for name, port in ports.items()}
        # no Alertmanager: the page is the alert firing in Prometheus (test_e2e_alerting
        # follows one on to Alertmanager and a webhook)
        with prometheus(tmp_path, targets, rules, "http://127.0.0.1:9") as prom:
            published = wait_for("both jobs stepping and publishing their stall bound",
                                 lambda: len(bounds(prom)) == 2 and bounds(prom), timeout=60)
            assert published == {"low": LOW, "high": HIGH}, published
            assert not prom.alerts(STALL), "stall alert before the hang"
            (tmp_path / "hang").touch()
            hung = time.time()
            low = wait_for("the low floor's page", lambda: paged(prom, "low"), timeout=40)
            assert not paged(prom, "high"), "the high floor paged as soon as the low one"
            high = wait_for("the high floor's page", lambda: paged(prom, "high"), timeout=40)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    after = {"low": low - hung, "high": high - hung}
    # the last step came at most a scrape before the hang; evaluations are 1 s apart
    assert after["low"] >= LOW - 2 and after["high"] >= HIGH - 2, after
    assert after["high"] - after["low"] >= (HIGH - LOW) / 2, after
    print(f"paged {after['low']:.1f} s after the hang with floor {LOW:g} s, "
          f"{after['high']:.1f} s with {HIGH:g} s")
