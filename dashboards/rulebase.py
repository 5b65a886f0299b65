"""What every rule is built from: the bounds (thresholds and ``for`` durations), the alert and
record constructors, the runbook address and the diagnosis cause each alert stands for.

The bottom of ``dashboards``' rule modules: ``fsdpmon.dashboards.alerts`` and
``fsdpmon.dashboards.rules`` build on it, and it imports neither.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from fsdpmon import catalog
from fsdpmon.catalog import Recorded
from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    CPU_THROTTLED_RATIO,
    CULPRIT_RULES_INTERVAL_SECONDS,
    GPU_LOW_UTILIZATION_RATIO,
    GPU_THROTTLED_TIME_SHARE,
    LOSS_DIVERGENCE_FACTOR,
    MEMORY_PRESSURE_RATIO,
    STALL_FOR_SECONDS,
    STRAGGLER_CAUSE_SHARE,
    THROUGHPUT_DROP_RATIO,
    Severity,
    cause_severity,
)
from fsdpmon.dashboards.promql import m

Rule = dict[str, Any]

HEARTBEAT = m(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS)
# Served from the monitor's start, before the first step completes: the "rank is alive" series.
AGE = m(catalog.TRAIN_HEARTBEAT_AGE_SECONDS)
STEP_TIME = m(catalog.TRAIN_STEP_TIME_SECONDS)
# The straggler line each rank publishes beside its scores (STRAGGLER_SCORE_THRESHOLD): a score
# is compared with its own rank's (one-to-one, same labels), never with a constant of the rules.
SCORE_LINE = m(catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD)


@dataclass(frozen=True)
class RuleBounds:
    """Alert thresholds and durations (Prometheus duration strings)."""

    # Stalled: no step within the stall bound each rank publishes (its own watchdog's:
    # max(FSDPMON_STALL_FACTOR x its median step time, FSDPMON_STALL_FLOOR_SECONDS)), so the
    # rules hold no stall bound of their own. That bound is already minutes (the floor), and
    # the culprit needs no confirming: stall_for only rides out lost scrapes (conventions'
    # STALL_FOR_SECONDS); docs/alerts.md adds up the page's whole path.
    stall_for: str = f"{STALL_FOR_SECONDS}s"
    # The culprit group's own evaluation interval ("": the server's). The shipped rules
    # (SHIPPED) set conventions' CULPRIT_RULES_INTERVAL_SECONDS; a variant built for a test
    # evaluates at the pace its own server sets (1 s), unless it names one.
    culprit_interval: str = ""
    # A rank seen within this window whose series are gone while its pod/target is still there.
    missing_lookback: str = "15m"
    missing_for: str = "2m"
    target_down_for: str = "3m"
    exporter_down_for: str = "5m"
    # Straggler: the rank's score (median busy time of the other ranks / its own) below the
    # threshold it publishes (SCORE_LINE), as its monitor's flag holds it.
    straggler_for: str = "15m"
    # ... on its data when this share of its extra busy time (over the job's median rank) is
    # extra data wait
    straggler_cause_share: float = STRAGGLER_CAUSE_SHARE
    # CPU limit: the rank's cgroup throttled in this share of its CFS periods (over the window)
    # while the others wait for it (its waited-for score below its published threshold).
    cpu_throttled_share: float = CPU_THROTTLED_RATIO
    cpu_throttled_window: str = "5m"
    cpu_throttled_for: str = "15m"
    # Starved of CPU by other work (no limit): as long as a straggler
    cpu_starved_for: str = "15m"
    # Checkpointing: the median rank's last save took this share of the time since the one before.
    checkpoint_share: float = CHECKPOINT_SHARE_LIMIT
    checkpoint_for: str = "15m"
    memory_ratio: float = MEMORY_PRESSURE_RATIO  # a rank's peak active memory / capacity
    memory_for: str = "5m"
    allocator_window: str = "15m"
    low_util_ratio: float = GPU_LOW_UTILIZATION_RATIO
    low_util_for: str = "20m"
    error_window: str = "15m"  # XID / ECC counters
    gpu_lost_for: str = "1m"
    # which rank a GPU serves: its processes seen within this window (a lost GPU has none now)
    gpu_owner_window: str = "5m"  # a GPU that stopped answering NVML (one failed read is no loss)
    throttle_for: str = "10m"
    # ... or held down this share of the time by NVML's accumulated clock-event time, over
    # throttle_window (a flag sampled per scrape misses throttling that comes and goes)
    throttle_share: float = GPU_THROTTLED_TIME_SHARE
    throttle_window: str = "5m"
    nonfinite_for: str = "1m"
    # The loss averaged over divergence_smoothing above factor x the lowest such average over
    # divergence_window. Both sides averaged: a logged loss is one step's, and the minimum of
    # raw samples is the noise's lowest dip (a healthy tiny job's 0.7 against a level of
    # 1.2-1.9 kept the raw rule pending for minutes on end).
    divergence_factor: float = LOSS_DIVERGENCE_FACTOR
    divergence_smoothing: str = "10m"
    divergence_window: str = "1h"
    divergence_for: str = "15m"
    throughput_drop_ratio: float = THROUGHPUT_DROP_RATIO  # tokens/s below ratio x its recent mean
    throughput_window: str = "1h"
    throughput_for: str = "15m"


# What ships: the defaults above, with the culprit group on its own short interval.
SHIPPED = RuleBounds(culprit_interval=f"{CULPRIT_RULES_INTERVAL_SECONDS}s")


def by_severity(table: dict[str, Severity]) -> dict[Severity, list[str]]:
    """A severity table's keys grouped by severity (critical first): one rule per group."""
    groups: dict[Severity, list[str]] = {}
    for severity in Severity:
        keys = [k for k, v in table.items() if v is severity]
        if keys:
            groups[severity] = keys
    return dict(sorted(groups.items(), key=lambda kv: kv[0] is not Severity.CRITICAL))


def rank_line() -> str:
    """Go template: the straggler line the alert's rank publishes (SCORE_LINE), read from
    Prometheus when the alert is sent."""
    return ('{{ with printf "' + SCORE_LINE + '{job_name=%q,rank=%q}" $labels.job_name '
            '$labels.rank | query }}{{ . | first | value | printf "%.2f" }}'
            '{{ else }}its threshold{{ end }}')


def rose(series: str, window: str) -> str:
    """A counter that went up within ``window``, including one born within it above 0.

    ``increase()`` needs a baseline sample: a series whose first sample is already 1 (the
    exporter creates ``fsdpmon_gpu_xid_errors_total{xid="79"}`` on the first XID 79) has an
    increase of 0, so that first event would never alert. The second arm catches a series that
    is above 0 now and had no sample ``window`` ago, for as long as ``increase()`` would have.
    After a Prometheus restart an old non-zero counter counts as new for one window: a repeat
    notification, never a missed event.
    """
    return f"increase({series}[{window}]) > 0\nor\n({series} > 0 unless {series} offset {window})"


def record(recorded: Recorded, expr: str) -> Rule:
    return {"record": recorded.name, "expr": expr}


# Where the runbook is published: docs/runbook.md of the fsdpmon repository, one `## <cause>`
# section per cause, so `<url>#<cause>` opens it. A team that hosts its own copy (a wiki, an
# internal Git server) generates the rules with its address: `python -m fsdpmon.dashboards
# --runbook-url URL` or FSDPMON_RUNBOOK_URL (dashboards/README.md); the committed rule file and
# `fsdpmon manifests` use this default.
DEFAULT_RUNBOOK_URL = "https://github.com/fsdpmon/fsdpmon/blob/main/docs/runbook.md"


def runbook_base(url: str) -> str:
    """``url`` checked as a runbook page address (http(s), no fragment: the cause is appended);
    ValueError saying what is wrong."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"runbook URL must be an http(s) address, got {url!r}")
    if parts.fragment or url.endswith("#"):
        raise ValueError(f"runbook URL must not have a #fragment (each alert appends "
                         f"#<cause>), got {url!r}")
    return url

# The diagnosis cause each alert stands for (`fsdpmon diagnose` names the same ones), so an
# alert, a finding and a runbook section share one name.
ALERT_CAUSES = {
    "FsdpmonCollectiveDesync": "collective_desync",
    "FsdpmonTrainingStalled": "hang",
    "FsdpmonRankUnresponsive": "rank_unresponsive",
    "FsdpmonRankDied": "rank_missing",
    "FsdpmonTrainingRankMissing": "rank_missing",
    "FsdpmonTrainingRanksShort": "rank_missing",
    "FsdpmonRankStraggling": "straggler_compute",
    "FsdpmonRankStragglingOnData": "straggler_data",
    "FsdpmonGPULost": "gpu_lost",
    "FsdpmonRankCpuThrottled": "cpu_throttled",
    "FsdpmonRankCpuStarved": "host_cpu_contention",
    "FsdpmonCheckpointSlow": "checkpoint_slow",
    "FsdpmonLossNonFinite": "loss_nonfinite",
    "FsdpmonLossDiverging": "loss_spike",
    "FsdpmonThroughputDropped": "straggler_compute",
    "FsdpmonGPUMemoryNearCapacity": "memory_pressure",
    "FsdpmonAllocatorRetries": "memory_pressure",
    "FsdpmonGPULowUtilization": "straggler_data",
    "FsdpmonGPUThrottling": "gpu_throttled",
    "FsdpmonGPUXidErrors": "gpu_xid",
    "FsdpmonGPUEccErrors": "gpu_ecc",
    "FsdpmonTrainingTargetDown": "target_down",
    "FsdpmonExporterDown": "target_down",
}


def alert(name: str, expr: str, for_: str, summary: str, description: str, hint: str,
          detail: str | None = None) -> Rule:
    """An alerting rule for the cause ALERT_CAUSES names; its ``severity`` label is that
    cause's in conventions.CAUSE_SEVERITY (``detail``: the XID code, clock-event reason or
    target kind, for the causes whose severity depends on it), the diagnosis' own."""
    rule: Rule = {"alert": name, "expr": expr}
    if for_ not in ("", "0s"):
        rule["for"] = for_
    cause = ALERT_CAUSES[name]  # a new alert must say which cause it stands for
    # severity: the word the diagnosis' findings use; cause: what Alertmanager groups by (one
    # incident, one notification) and the runbook's section
    rule["labels"] = {"severity": cause_severity(cause, detail).value, "cause": cause}
    # runbook_url is added by rule_groups(), which knows where the runbook is published
    rule["annotations"] = {"summary": summary, "description": description, "hint": hint,
                           "cause": cause}
    return rule


def with_runbook(rules: list[Rule], base: str) -> list[Rule]:
    for rule in rules:
        if "alert" in rule:
            notes = rule["annotations"]
            notes["runbook_url"] = f"{base}#{notes['cause']}"
    return rules
