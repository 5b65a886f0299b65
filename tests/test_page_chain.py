"""The shipped path from a hang to its page: every term short, each set once, the doc's figures
the settings' own.

The terms (docs/alerts.md, "From a hang to the page"): the stall bound the rank publishes, the
PodMonitor's scrape interval, the culprit group's own evaluation interval, the stall alerts'
`for` and Alertmanager's group_wait for critical causes. A group that loses its interval falls
back to the server's (kube-prometheus-stack: 30 s), a route that loses its critical branch to
30 s: both fail here, not in a page that comes late.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fsdpmon import conventions as conv
from fsdpmon.dashboards.generate import GENERATED, RULES_FILE
from fsdpmon.dashboards.rulebase import RuleBounds
from fsdpmon.dashboards.rules import CULPRIT_GROUP, rule_groups
from fsdpmon.manifests import alerting
from fsdpmon.manifests.config import ManifestConfig
from fsdpmon.manifests.monitoring import prometheus_rule, training_podmonitor

ROOT = Path(__file__).resolve().parents[1]
# the alerts that page a stopped job: a hang, a stopped rank, and a desync (which hangs too)
STALL_ALERTS = {"FsdpmonTrainingStalled", "FsdpmonRankUnresponsive", "FsdpmonCollectiveDesync"}
# what a hang's page may wait for at most, over the stall bound (issue 49: a page within a
# minute once the bound is drawn from evidence); each term below is checked against its setting
PAGE_OVER_BOUND_MAX_S = 60


def _cfg() -> ManifestConfig:
    return ManifestConfig(job_name="llama", image="reg.io/fsdp:1", exporter_image="reg.io/e:1")


def _culprit_group(groups: list[dict]) -> dict:
    return next(g for g in groups if g["name"] == CULPRIT_GROUP)


def _interval_s(group: dict) -> float:
    return alerting.seconds(group["interval"])


def test_the_stall_alerts_live_in_the_culprit_group():
    """The group's interval is theirs only while they are in it."""
    alerts = {r["alert"] for r in _culprit_group(rule_groups())["rules"] if "alert" in r}
    assert alerts == STALL_ALERTS


@pytest.mark.parametrize("source", ["generated", "committed", "manifest"])
def test_the_culprit_group_sets_its_own_short_interval(source):
    groups = {"generated": rule_groups,
              "committed": lambda: yaml.safe_load((GENERATED / RULES_FILE).read_text())["groups"],
              "manifest": lambda: prometheus_rule(_cfg(), rule_groups())["spec"]["groups"]}
    group = _culprit_group(groups[source]())
    assert "interval" in group, f"{source}: {CULPRIT_GROUP} evaluates at the server's interval"
    assert _interval_s(group) == conv.CULPRIT_RULES_INTERVAL_SECONDS <= 15


def test_a_variant_for_a_test_runs_at_its_servers_pace():
    """RuleBounds() without an interval: the e2e tests' 1 s server sets it."""
    assert "interval" not in _culprit_group(rule_groups(RuleBounds(stall_for="0s")))


def test_the_stall_alerts_wait_their_for_and_no_longer():
    rules = [r for r in _culprit_group(rule_groups())["rules"] if r.get("alert") in STALL_ALERTS]
    assert {alerting.seconds(r["for"]) for r in rules} == {conv.STALL_FOR_SECONDS}
    # it rides out one late or lost scrape, and no more: two scrapes, not three
    assert 2 <= conv.STALL_FOR_SECONDS / conv.TRAINING_SCRAPE_INTERVAL_SECONDS < 3


def test_the_podmonitor_scrapes_within_the_culprit_groups_interval():
    endpoint = training_podmonitor(_cfg())["spec"]["podMetricsEndpoints"][0]
    assert alerting.seconds(endpoint["interval"]) == conv.TRAINING_SCRAPE_INTERVAL_SECONDS <= 15
    assert conv.TRAINING_SCRAPE_INTERVAL_SECONDS <= conv.CULPRIT_RULES_INTERVAL_SECONDS


def _fsdpmon_route(config: dict) -> dict:
    return config["route"]["routes"][0]


def test_critical_causes_wait_the_short_group_wait_warnings_the_long_one():
    route = alerting.alertmanager_config()
    fsdpmon = _fsdpmon_route(route)
    stalled = next(r for r in _culprit_group(rule_groups())["rules"]
                   if r.get("alert") == "FsdpmonTrainingStalled")
    matcher = f'severity="{stalled["labels"]["severity"]}"'  # what a hang's page carries
    critical = [r for r in fsdpmon["routes"] if r["matchers"] == [matcher]]
    assert len(critical) == 1, fsdpmon
    assert alerting.seconds(critical[0]["group_wait"]) == conv.CRITICAL_GROUP_WAIT_SECONDS <= 10
    assert "group_by" not in critical[0]  # inherited: one incident, one notification still
    assert critical[0]["receiver"] == alerting.RECEIVER
    assert alerting.seconds(route["route"]["group_wait"]) == conv.WARNING_GROUP_WAIT_SECONDS


def test_a_shortened_group_wait_shortens_the_critical_one_too():
    fast = _fsdpmon_route(alerting.alertmanager_config(group_wait="1s"))
    assert fast["routes"][0]["group_wait"] == "1s"
    slow = _fsdpmon_route(alerting.alertmanager_config(group_wait="1m"))
    assert slow["routes"][0]["group_wait"] == alerting.CRITICAL_GROUP_WAIT


@pytest.mark.parametrize("bad", ["5", "5 s", "1d", ""])
def test_a_duration_the_route_cannot_take_is_refused(bad):
    with pytest.raises(ValueError, match="is not a duration"):
        alerting.seconds(bad)


def _doc_rows() -> dict[str, str]:
    """docs/alerts.md's chain table: term -> its seconds column."""
    text = (ROOT / "docs" / "alerts.md").read_text()
    section = text.split("## From a hang to the page", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", section, flags=re.M)
    return {term: seconds for term, seconds in rows if term not in ("term", "---")}


def test_the_doc_gives_each_terms_shipped_seconds_and_their_total():
    floor = conv.DEFAULT_STALL_WAIT_FLOOR_SECONDS  # the waiting ranks' bound
    least = floor + conv.STALL_FOR_SECONDS + conv.CRITICAL_GROUP_WAIT_SECONDS
    most = least + conv.CULPRIT_RULES_INTERVAL_SECONDS
    assert _doc_rows() == {
        "stall bound": f"{floor:.0f} s",
        "scrape interval": f"{conv.TRAINING_SCRAPE_INTERVAL_SECONDS} s",
        "evaluation interval": f"{conv.CULPRIT_RULES_INTERVAL_SECONDS} s",
        "rule `for`": f"{conv.STALL_FOR_SECONDS} s",
        "group_wait": f"{conv.CRITICAL_GROUP_WAIT_SECONDS} s",
        "total": f"{least:.0f} to {most:.0f} s",
    }
    assert most - floor <= PAGE_OVER_BOUND_MAX_S
    assert most <= 60, f"the page takes up to {most} s after the waiting ranks' entering"
