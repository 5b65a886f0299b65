"""The generated rules hold the thresholds and severities of fsdpmon/conventions.py, and nothing
else: every number an expression compares with is the conventions constant it stands for (the
stall and straggler lines are no numbers at all: the series each rank publishes), and every
alert's severity is its cause's in the one severity table the diagnosis reads too.

Both the committed file (what a platform team loads) and a fresh generation are read, so a
changed constant fails here until the rules are regenerated, and a number compiled into a rule
by hand fails always.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fsdpmon import catalog, conventions
from fsdpmon.conventions import (
    CAUSE_SEVERITY,
    GPU_THROTTLE_REASONS,
    GPU_XID_CRITICAL,
    TARGET_DOWN_SEVERITY,
    THROTTLE_SEVERITY,
    xid_severity,
)
from fsdpmon.dashboards.generate import GENERATED, RULES_FILE
from fsdpmon.dashboards.rules import rule_groups
from fsdpmon.diagnose.findings import CAUSES

REPO = Path(__file__).resolve().parents[1]

# The conventions constants each alert compares with; an alert not named compares with none.
THRESHOLDS = {
    "FsdpmonRankDied": ("CRASH_EVIDENCE_SECONDS",),
    "FsdpmonRankStragglingOnData": ("STRAGGLER_CAUSE_SHARE",),
    "FsdpmonRankStraggling": ("STRAGGLER_CAUSE_SHARE",),  # unless it is the data's
    "FsdpmonRankCpuThrottled": ("CPU_THROTTLED_RATIO",),
    "FsdpmonRankCpuStarved": ("CPU_THROTTLED_RATIO",),
    "FsdpmonCheckpointSlow": ("CHECKPOINT_SHARE_LIMIT", "STRAGGLER_CAUSE_SHARE"),
    "FsdpmonLossDiverging": ("LOSS_DIVERGENCE_FACTOR",),
    "FsdpmonThroughputDropped": ("THROUGHPUT_DROP_RATIO",),
    "FsdpmonGPUMemoryNearCapacity": ("MEMORY_PRESSURE_RATIO",),
    "FsdpmonGPULowUtilization": ("GPU_LOW_UTILIZATION_RATIO",),
    "FsdpmonGPUThrottling": ("GPU_THROTTLED_TIME_SHARE",),
    "FsdpmonGPUXidErrors": ("GPU_XID_CRITICAL",),  # the dcgm arm's `== code`
}
# Where each rank's own bound stands in for a number.
PUBLISHED = {
    "FsdpmonTrainingStalled": catalog.TRAIN_STALL_THRESHOLD_SECONDS.name,
    "FsdpmonRankStraggling": catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name,
    "FsdpmonRankStragglingOnData": catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name,
    "FsdpmonRankCpuThrottled": catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name,
    "FsdpmonRankCpuStarved": catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name,
}
DCGM_GROUP = "fsdpmon-dcgm.rules"  # unit factors and NVML's bit values, not thresholds
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"')
_RANGES = re.compile(r"\[[^\]]*\]|offset \w+")
# quantile's and topk's first argument (the median, one series) are no thresholds
_ARGS = re.compile(r"\b(?:quantile|topk)(?: by \([^)]*\))? \(\s*[\d.]+,")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.])")
# 0 and 1: a flag's values, `> 0` for "any", `* 0` to keep labels, `- 1` for "the others"
STRUCTURAL = {0.0, 1.0}


def numbers(expr: str) -> list[float]:
    bare = _ARGS.sub("(", _RANGES.sub("", _STRINGS.sub('""', expr)))
    return sorted(float(n) for n in _NUMBER.findall(bare) if float(n) not in STRUCTURAL)


def expected(name: str) -> list[float]:
    values: list[float] = []
    for const in THRESHOLDS.get(name, ()):
        value = getattr(conventions, const)
        values += [float(v) for v in value] if isinstance(value, tuple) else [float(value)]
    return sorted(values)


def committed() -> list[dict]:
    return yaml.safe_load((GENERATED / RULES_FILE).read_text())["groups"]


SOURCES = {"committed": committed, "generated": rule_groups}


@pytest.mark.parametrize("source", SOURCES)
def test_every_number_in_the_rules_is_its_conventions_constant(source):
    wrong = []
    for group in SOURCES[source]():
        if group["name"] == DCGM_GROUP:
            continue
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            found = sorted(set(numbers(rule["expr"])))
            if found != sorted(set(expected(name))):
                wrong.append(f"{name}: {found}, conventions say {sorted(set(expected(name)))}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source", SOURCES)
def test_stall_and_straggler_rules_compare_with_the_bound_each_rank_publishes(source):
    alerts = [r for g in SOURCES[source]() for r in g["rules"] if r.get("alert") in PUBLISHED]
    assert {r["alert"] for r in alerts} == set(PUBLISHED)
    for rule in alerts:
        assert PUBLISHED[rule["alert"]] in rule["expr"], rule["alert"]
    stalled = next(r for g in SOURCES[source]() for r in g["rules"]
                   if r.get("record") == catalog.REC_JOB_STALLED_RANKS_COUNT.name)
    assert f"> {catalog.TRAIN_STALL_THRESHOLD_SECONDS.name}" in stalled["expr"]


def _xid_codes(expr: str) -> tuple[str, set[int]]:
    """The XID matcher of an XID rule: ("=~" or "!~", its codes)."""
    match = re.search(r'xid(=~|!~)"([\d|]+)"', expr)
    assert match, expr
    return match.group(1), {int(c) for c in match.group(2).split("|")}


def severity_of(rule: dict) -> str:
    """The severity conventions.py gives the alert's cause, told by what its expression
    selects where the cause's severity depends on it."""
    cause, expr = rule["labels"]["cause"], rule["expr"]
    if cause == "gpu_xid":
        op, codes = _xid_codes(expr)
        assert codes == set(GPU_XID_CRITICAL), codes
        severities = {xid_severity(c) for c in codes} if op == "=~" else {xid_severity(13)}
        assert len(severities) == 1, severities
        return severities.pop().value
    if cause == "gpu_throttled":
        reasons = re.search(r'reason=~"([\w|]+)"', expr).group(1).split("|")
        assert set(reasons) <= set(GPU_THROTTLE_REASONS), reasons
        return {THROTTLE_SEVERITY[r].value for r in reasons}.pop()
    if cause == "target_down":
        kind = "train" if catalog.TRAIN_INFO.name in expr else "exporter"
        return TARGET_DOWN_SEVERITY[kind].value
    return CAUSE_SEVERITY[cause].value


@pytest.mark.parametrize("source", SOURCES)
def test_every_alert_severity_is_its_causes_in_conventions(source):
    alerts = [r for g in SOURCES[source]() for r in g["rules"] if "alert" in r]
    wrong = [(r["alert"], r["labels"]["severity"], severity_of(r)) for r in alerts
             if r["labels"]["severity"] != severity_of(r)]
    assert not wrong, wrong
    xid = sorted(r["labels"]["severity"] for r in alerts if r["alert"] == "FsdpmonGPUXidErrors")
    assert xid == ["critical", "warning"]  # 79 pages critical, 13 warns
    throttled = {r for rule in alerts if rule["alert"] == "FsdpmonGPUThrottling"
                 for r in re.search(r'reason=~"([\w|]+)"', rule["expr"]).group(1).split("|")}
    assert throttled == set(GPU_THROTTLE_REASONS)


def test_the_severity_table_covers_every_cause_and_only_those():
    assert set(CAUSE_SEVERITY) == set(CAUSES)
    assert xid_severity(79) is xid_severity("79") is conventions.Severity.CRITICAL
    assert xid_severity(13) is xid_severity("13") is conventions.Severity.WARNING


def test_the_docs_severity_table_is_the_conventions_one():
    text = (REPO / "docs" / "alerts.md").read_text()
    rows = dict(re.findall(r"^\| (critical|warning) \| ([\w, ]+) \|$", text, flags=re.M))
    documented = {cause: severity for severity, causes in rows.items()
                  for cause in causes.split(", ")}
    # gpu_xid, gpu_throttled's reasons and target_down are told apart in the text below it
    table = {c: s.value for c, s in CAUSE_SEVERITY.items() if c not in ("gpu_xid", "target_down")}
    assert documented == table
    codes = ", ".join(str(c) for c in GPU_XID_CRITICAL)
    assert f"`GPU_XID_CRITICAL` ({codes}:" in " ".join(text.split())
