"""Rules: promtool accepts the shipped file, and promtool unit tests cover every alert.

Every alert needs, in ``tests/rules/*.yaml``: a case where it fires, a later evaluation in the same
test group where it has resolved, and a silent evaluation on the healthy run
(``tests/rules/healthy.yaml``). Metric names in rule expressions must be catalogued, recorded by
these rules (``level:metric:operations`` names, deliberately not in the catalog), Prometheus' or
kube-state-metrics' own (``up``, ``kube_pod_info``, ``kube_pod_status_phase``), or, in the
dcgm-exporter group only, the DCGM fields that group maps.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fsdpmon import catalog
from fsdpmon.dashboards import dcgm
from fsdpmon.dashboards.build import all_dashboards
from fsdpmon.dashboards.generate import GENERATED, RULES_FILE, rules_yaml
from fsdpmon.dashboards.promql import metric_names
from fsdpmon.dashboards.rulebase import SHIPPED, RuleBounds
from fsdpmon.dashboards.rules import alert_names, recorded_names, rule_groups
from fsdpmon.diagnose import CAUSES

ROOT = Path(__file__).resolve().parents[1]
RULE_TESTS = sorted((ROOT / "tests" / "rules").glob("*.yaml"))
HEALTHY = ROOT / "tests" / "rules" / "healthy.yaml"
EXTERNAL = {"up", "kube_pod_info", "kube_pod_status_phase", "ALERTS"}  # ALERTS: Prometheus's own
RECORDED_NAME = re.compile(r"fsdpmon_[a-z]+:[a-z0-9_]+:[a-z0-9_]+")

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool missing: run scripts/setup.sh --test")


def promtool(*args: str) -> subprocess.CompletedProcess:
    # One core (GOMAXPROCS): this file is not `slow`, so it runs beside the `alone` tests
    # (tests/conftest.py), which it must load no more than a unit test does.
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "GOMAXPROCS": "1"})


def test_promtool_accepts_the_shipped_rule_file():
    out = promtool("check", "rules", str(GENERATED / RULES_FILE))
    assert out.returncode == 0, out.stdout + out.stderr
    total = sum(len(g["rules"]) for g in rule_groups())
    assert f"SUCCESS: {total} rules found" in out.stdout


@pytest.mark.skipif(shutil.which("vmalert") is None,
                    reason="needs vmalert (scripts/setup.sh --test installs victoria-metrics)")
def test_vmalert_accepts_the_shipped_rule_file():
    """VictoriaMetrics' rule evaluator (Debian's 1.79) parses every expression and template."""
    out = subprocess.run(["vmalert", f"-rule={GENERATED / RULES_FILE}", "-dryRun"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def test_promtool_accepts_a_fast_variant(tmp_path):
    fast = RuleBounds(stall_for="0s", missing_for="0s")
    path = tmp_path / "fast.yaml"
    path.write_text(rules_yaml(fast))
    out = promtool("check", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    stall = next(r for g in rule_groups(fast) for r in g["rules"]
                 if r.get("alert") == "FsdpmonTrainingStalled")
    # no bound of the rules' own: the one each rank publishes
    assert "for" not in stall and "> fsdpmon_train_stall_threshold_seconds" in stall["expr"]


def test_promtool_unit_tests_pass():  # promtool evaluates hours of series: ~20 s of one core
    assert len(RULE_TESTS) >= 4
    out = promtool("test", "rules", *map(str, RULE_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr


def _minutes(duration: str) -> float:
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, duration
    h, m, s = (int(p or 0) for p in parts.groups())
    return h * 60 + m + s / 60


def _cases(path: Path) -> list[tuple[str, str, float, bool]]:
    """(test group, alert, eval minute, fires?) for every alert_rule_test in a file."""
    doc = yaml.safe_load(path.read_text())
    assert doc["rule_files"] == ["../../dashboards/generated/fsdpmon-rules.yaml"]
    return [(group.get("name", ""), case["alertname"], _minutes(case["eval_time"]),
             bool(case.get("exp_alerts")))
            for group in doc["tests"] for case in group.get("alert_rule_test", [])]


@pytest.mark.parametrize("alert", alert_names())
def test_every_alert_fires_resolves_and_stays_silent_when_healthy(alert):
    bad = [c for p in RULE_TESTS if p != HEALTHY for c in _cases(p) if c[1] == alert]
    fired = [(g, t) for g, _, t, fires in bad if fires]
    assert fired, f"no promtool test makes {alert} fire"
    resolved = [(g, t) for g, _, t, fires in bad if not fires
                and any(g == fg and t > ft for fg, ft in fired)]
    assert resolved, f"no promtool test shows {alert} resolving after it fired"
    healthy = [c for c in _cases(HEALTHY) if c[1] == alert]
    assert healthy and not any(fires for *_, fires in healthy)


def test_rule_expressions_name_only_known_metrics():
    known = set(catalog.all_series_names()) | recorded_names() | EXTERNAL
    for group in rule_groups():
        allowed = known | (dcgm.source_metrics() if group["name"] == "fsdpmon-dcgm.rules"
                           else set())
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names, rule
            assert names <= allowed, f"{group['name']}: unknown {names - allowed}"


def test_recorded_names_follow_level_metric_operations():
    for group in rule_groups():
        for rule in group["rules"]:
            if "record" not in rule:
                continue
            name = rule["record"]
            if group["name"] == "fsdpmon-dcgm.rules" and name in catalog.BY_NAME:
                continue  # dcgm-exporter fields recorded under the catalog's own GPU names
            assert RECORDED_NAME.fullmatch(name), name
            assert name not in catalog.BY_NAME


def test_each_catalogued_recorded_series_has_exactly_one_rule():
    """The catalog names them, the rules define them: neither side may drift from the other.
    One series may take several rules when each adds labels of its own (the stall culprits,
    one rule per reason): one rule per (name, labels)."""
    rules = [r for g in rule_groups() for r in g["rules"] if "record" in r]
    keyed = [(r["record"], tuple(sorted(r.get("labels", {}).items()))) for r in rules]
    assert len(keyed) == len(set(keyed)), sorted(k for k in keyed if keyed.count(k) > 1)
    records = sorted({r["record"] for r in rules})
    ours = [n for n in records if n not in catalog.BY_NAME]
    catalogued = sorted(r.name for r in catalog.RECORDED)
    assert sorted(ours) == catalogued, (
        f"rules without a catalog symbol: {sorted(set(ours) - set(catalogued))}; "
        f"symbols without a rule: {sorted(set(catalogued) - set(ours))}; "
        f"{len(ours)} rules for {len(catalogued)} symbols")


def test_dcgm_mapping_records_catalogued_gpu_metrics_with_their_labels():
    records = [r for g in rule_groups() if g["name"] == "fsdpmon-dcgm.rules" for r in g["rules"]]
    gpu_names = {m.name for m in catalog.GPU}
    for rule in records:
        if rule["record"] in catalog.BY_NAME:
            assert rule["record"] in gpu_names
            for label in rule.get("labels", {}):
                assert label in catalog.get(rule["record"]).labels
    mapped = {r["record"] for r in records}
    assert {"fsdpmon_gpu_utilization_ratio", "fsdpmon_gpu_memory_used_bytes",
            "fsdpmon_gpu_temperature_celsius", "fsdpmon_gpu_power_watts",
            "fsdpmon_gpu_clock_event_active"} <= mapped


def test_alerts_carry_severity_summary_description_and_hint():
    names = alert_names()
    assert len(names) == len(set(names)) >= 14
    # one name may take one rule per severity (the XID alert), never two of the same
    rules = [(r["alert"], r["labels"]["severity"]) for g in rule_groups() for r in g["rules"]
             if "alert" in r]
    assert len(rules) == len(set(rules)), sorted(rules)
    for group in rule_groups():
        assert set(group) <= {"name", "interval", "rules"}  # what promtool 2.42 accepts
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}
            notes = rule["annotations"]
            assert set(notes) == {"summary", "description", "hint", "cause", "runbook_url"}
            assert all(len(notes[k]) > 20 for k in ("summary", "description", "hint")), (
                rule["alert"])
            assert notes["cause"] in CAUSES, (rule["alert"], notes["cause"])
            assert notes["runbook_url"].endswith(f"docs/runbook.md#{notes['cause']}")


def test_runbook_has_one_section_per_cause():
    """Every cause (each alert's and each finding's) has its section, with the three parts."""
    text = (ROOT / "docs" / "runbook.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    names = [s.split("\n", 1)[0].strip() for s in sections]
    assert names == list(CAUSES), names
    for name, body in zip(names, sections, strict=True):
        for part in ("What it means", "How to confirm", "What to do on EKS"):
            assert f"**{part}**" in body, (name, part)


def test_committed_rule_file_is_the_plain_rule_groups():
    doc = yaml.safe_load((GENERATED / RULES_FILE).read_text())
    assert doc == {"groups": rule_groups()}


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(RuleBounds)])
def test_every_bound_changes_the_rules(field):
    default = getattr(SHIPPED, field)
    changed = "7m" if isinstance(default, str) else default * 3 + 0.5
    variant = dataclasses.replace(SHIPPED, **{field: changed})
    assert rule_groups(variant) != rule_groups(), f"RuleBounds.{field} is not used"


def test_the_shipped_bounds_are_the_defaults_but_the_culprit_groups_interval():
    """A test's RuleBounds(...) differs from what ships only in the pace its server sets."""
    assert dataclasses.replace(SHIPPED, culprit_interval="") == RuleBounds()
    assert rule_groups(SHIPPED) == rule_groups()


def test_user_guide_lists_every_alert_and_dashboard():
    guide = (ROOT / "docs" / "dashboards.md").read_text()
    missing = [name for name in [*alert_names(), *all_dashboards()] if f"`{name}`" not in guide]
    assert not missing, f"docs/dashboards.md lacks {len(missing)}: {missing}"
