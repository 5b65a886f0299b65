"""End to end on VictoriaMetrics: one real hang paged through vmagent -> victoria-metrics ->
vmalert -> Alertmanager -> a webhook of this test (issue 49, item 5).

A 2-rank CPU job of the tiny trainer (tests/diagnose_job.py's, stall floor 8 s) hangs rank 1 in
its data loader a few seconds after its first step. vmagent scrapes it every second with the pod
and node labels Kubernetes discovery would add; vmalert evaluates the generated rules with only
their durations shortened (no ``for`` on the stall: the job-level alert gets no grace to hide
behind) and writes its records back to VictoriaMetrics; Alertmanager runs the shipped route
with shortened timers. Checked:
1. exactly one notification group for (job, hang), naming rank 1 with its pod and node, and no
   notification at all without a culprit rank, before the page or in the seconds after it.
   vmalert reads its own records back only after a remote-write flush and a query, so a rule
   chained on records sees them evaluations late; the job-level "every rank waits alike" alert
   must not fire in that gap (it reads the raw progress series, dashboards/culprits.py);
2. `fsdpmon diagnose --prometheus` and `fsdpmon incidents --prometheus`, pointed at
   VictoriaMetrics' Prometheus-compatible API, name the same cause and rank as
   `fsdpmon diagnose --targets` on the pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
from diagnose_job import faulty_job, stepping
from prometheus_stack import ALERTMANAGER, Webhook, alertmanager, wait_for
from victoria_stack import missing, victoria

from fsdpmon.dashboards.generate import rules_yaml
from fsdpmon.dashboards.rulebase import RuleBounds
from fsdpmon.manifests.alerting import alertmanager_config

# Not ``alone``: what it checks are counts and orders (one group, no rank-less notification
# before or after the page), not bounds. Beside test_integrations (eight ranks on two cores)
# it passed three times in three, in 85-92 s instead of 50.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.skipif(bool(missing()), reason=f"Debian victoria-metrics binaries missing: "
                       f"{', '.join(missing())} (scripts/setup.sh --test installs them)"),
    pytest.mark.skipif(not os.access(ALERTMANAGER, os.X_OK),
                       reason="Debian prometheus-alertmanager missing"),
]

JOB = "e2e-diagnose"  # diagnose_job's job name
SCRAPE_JOB = "fsdpmon-train"
POD, NODE = "e2e-victoria-pod-0", "e2e-victoria-node"
HUNG = 1
# rank 1 hangs in its loader this long after its first step: a few healthy scrapes first
HANG = f"hang:rank={HUNG},where=data,after=3"
FAST = RuleBounds(stall_for="0s")
# the hung rank past its bound, counted from a real step (not from the 0 of a rank yet to step)
STALLED = (f'(time() - fsdpmon_train_last_step_timestamp_seconds{{job_name="{JOB}", '
           f'rank="{HUNG}"}} > fsdpmon_train_stall_threshold_seconds)'
           f' and on (job_name, rank) fsdpmon_train_step > 0')
# How long the webhook must stay quiet after the page (a job-level alert that a late record
# resolves would come within a few 1 s evaluations).
QUIET_AFTER_S = 6.0


def notes_for(hook: Webhook) -> list[dict]:
    return [n for n in hook.received() if n["groupLabels"].get("job_name") == JOB]


def summary(notes: list[dict]) -> list[tuple[str, str, str, str]]:
    """(group key, alert, rank, status) per alert: what a failure message shows."""
    return [(n["groupKey"], a["labels"].get("alertname", ""), a["labels"].get("rank", "-"),
             a["status"]) for n in notes for a in n["alerts"]]


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fsdpmon.cli", *args, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


SAID: dict[int, str] = {}  # pid -> the end of what a CLI printed: a failure message shows it


def read_json(proc: subprocess.Popen, key: str) -> list[tuple[str, int | None]]:
    """(cause, rank) of each entry under ``key`` in a CLI's JSON (AssertionError with its
    stderr when it gave none)."""
    out, err = proc.communicate(timeout=90)
    SAID[proc.pid] = f"stdout {out[-1500:]!r}, stderr {err[-1500:]!r}"
    try:
        return [(f["cause"], f.get("rank")) for f in json.loads(out)[key]]
    except (ValueError, KeyError) as exc:
        raise AssertionError(f"{proc.args[3]} exited {proc.returncode} ({exc}): "
                             f"{err[-2000:]}") from None


@pytest.fixture
def stack(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(FAST))
    with contextlib.ExitStack() as stack:
        job = stack.enter_context(faulty_job(tmp_path, train_fault=HANG))
        hook = stack.enter_context(Webhook())
        route = alertmanager_config(hook.url, group_wait="1s", group_interval="1s",
                                    repeat_interval="1h")
        am = stack.enter_context(alertmanager(tmp_path, hook.url, route))
        vm = stack.enter_context(victoria(
            tmp_path / "vm", {SCRAPE_JOB: job.urls[0]}, rules, am,
            {SCRAPE_JOB: {"pod": POD, "node": NODE}}))
        yield job, hook, vm


def test_hang_pages_once_with_its_culprit_through_victoriametrics(stack):
    job, hook, vm = stack
    began = time.monotonic()
    # read from the pod: VictoriaMetrics 1.79 remembers a query for a series not yet
    # indexed as empty for ~9 s after the series comes (measured), so polling it for the
    # first step would only add that to the test's time
    job.wait("both ranks stepping", stepping(2), timeout_s=90)
    stepping_at = time.monotonic()
    assert not vm.rule_problems(), vm.rule_problems()

    def paged() -> list[dict]:
        return [n for n in notes_for(hook) if any(
            a["labels"].get("rank") == str(HUNG) for a in n["alerts"])]

    # Both diagnoses start once VictoriaMetrics holds the stall (a rank past its bound), so
    # their 12 s window runs while the rules' records catch up, not after the page.
    wait_for("a rank past its stall bound in VictoriaMetrics", lambda: vm.query(STALLED),
             timeout=60)
    stalled_at = time.monotonic()
    direct = cli("diagnose", "--targets", job.urls[0], "--for", "12s", "--interval", "1")
    big = cli("diagnose", "--prometheus", vm.url, "--job", JOB, "--for", "12s",
              "--interval", "1")
    page = wait_for(f"the hang's page ({summary(notes_for(hook))})", paged, timeout=60)[0]
    paged_at = time.monotonic()
    told = cli("incidents", "--prometheus", vm.url, "--job", JOB, "--since", "5m",
               "--step", "1")
    culprit = next(a["labels"] for a in page["alerts"] if a["labels"].get("rank"))
    assert (culprit["alertname"], culprit["cause"], culprit["reason"], culprit["pod"],
            culprit["node"]) == ("FsdpmonTrainingStalled", "hang", "behind", POD, NODE), culprit
    by_pod, by_vm = read_json(direct, "findings"), read_json(big, "findings")
    incidents = read_json(told, "incidents")
    time.sleep(max(0.0, QUIET_AFTER_S - (time.monotonic() - paged_at)))
    assert job.train.poll() is None, job.log_tail()

    notes = notes_for(hook)
    groups = {n["groupKey"] for n in notes}
    assert len(groups) == 1, f"one incident, one group: {summary(notes)}"
    named = {(a["labels"]["alertname"], a["labels"].get("rank"), a["labels"].get("pod"))
             for n in notes for a in n["alerts"]}
    assert named == {("FsdpmonTrainingStalled", str(HUNG), POD)}, (
        f"every notification names rank {HUNG}, none the job alone: {summary(notes)}")
    assert ("hang", HUNG) in by_pod, f"diagnose --targets: {by_pod}"
    assert ("hang", HUNG) in by_vm, (
        f"diagnose --prometheus (VictoriaMetrics): {by_vm}; it said {SAID[big.pid]}")
    assert ("hang", 1 - HUNG) not in by_pod + by_vm, (by_pod, by_vm)
    hangs = [i for i in incidents if i[0] in ("hang", "rank_unresponsive")]
    assert hangs == [("hang", HUNG)], f"incidents --prometheus (VictoriaMetrics): {incidents}"
    print(f"VictoriaMetrics: first step seen {stepping_at - began:.0f} s after the stack was "
          f"up, a rank past its bound {stalled_at - stepping_at:.0f} s later (hang 3 s after "
          f"the first step, 8 s bound), the page {paged_at - stalled_at:.0f} s after that; "
          f"{time.monotonic() - began:.0f} s in all")
