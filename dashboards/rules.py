"""Prometheus recording and alerting rules for FSDP jobs, built from the metric catalog.

``rule_groups()`` returns plain rule groups (only the keys promtool 2.42 accepts: ``name``,
``interval``, ``rules``), which ``python -m fsdpmon.dashboards`` writes to
``dashboards/generated/fsdpmon-rules.yaml`` and the Kubernetes manifests wrap in a
PrometheusRule. Every threshold, ``for`` duration and group interval is a field of
:class:`fsdpmon.dashboards.rulebase.RuleBounds`, so the end-to-end test can generate a fast
variant while the shipped ones (``rulebase.SHIPPED``) suit real jobs; where the runbook is
published (each alert's ``runbook_url``) is ``rule_groups``' ``runbook_url``.

Recorded names follow ``level:metric:operations`` (``fsdpmon_job:tokens_per_second:sum``); each is
a :class:`fsdpmon.catalog.Recorded` symbol (``catalog.REC_JOB_TOKENS_PER_SECOND_SUM``), and this
module holds its expression. The dcgm-exporter group records catalogued GPU names instead, so
dashboards and alerts work on clusters that run dcgm-exporter instead of the fsdpmon exporter.
"""

from __future__ import annotations

from typing import Any

from fsdpmon import catalog
from fsdpmon.dashboards.alerts import target_alerts, training_alerts
from fsdpmon.dashboards.culprits import culprit_alerts, culprit_records
from fsdpmon.dashboards.dcgm import dcgm_rules
from fsdpmon.dashboards.gpu_alerts import gpu_alerts
from fsdpmon.dashboards.promql import JOB_KEYS, m
from fsdpmon.dashboards.rulebase import (
    AGE,
    DEFAULT_RUNBOOK_URL,
    HEARTBEAT,
    SHIPPED,
    STEP_TIME,
    Rule,
    RuleBounds,
    record,
    runbook_base,
    with_runbook,
)

CULPRIT_GROUP = "fsdpmon-culprits"


def training_records() -> list[Rule]:
    """Job-level figures (one series per namespace/job_name) reused by dashboards and alerts."""
    by = f"by ({JOB_KEYS})"
    tps = m(catalog.TRAIN_TOKENS_PER_SECOND)
    return [
        record(catalog.REC_JOB_TOKENS_PER_SECOND_SUM, f"sum {by} ({tps})"),
        record(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG, f"avg {by} ({tps})"),
        record(catalog.REC_JOB_RANKS_COUNT, f"count {by} ({AGE})"),
        record(catalog.REC_JOB_HEARTBEAT_AGE_SECONDS_MAX, f"max {by} (time() - {HEARTBEAT})"),
        record(catalog.REC_JOB_STEP_TIME_SECONDS_MAX, f"max {by} ({STEP_TIME})"),
        record(catalog.REC_JOB_STEP_TIME_SECONDS_P50, f"quantile {by} (0.5, {STEP_TIME})"),
        record(catalog.REC_JOB_MFU_RATIO_AVG, f"avg {by} ({m(catalog.TRAIN_MFU_RATIO)})"),
        record(catalog.REC_JOB_LOSS_AVG, f"avg {by} ({m(catalog.TRAIN_LOSS)})"),
        record(catalog.REC_JOB_LOSS_MAX, f"max {by} ({m(catalog.TRAIN_LOSS)})"),
        record(catalog.REC_JOB_DATA_WAIT_RATIO_MAX,
                f"max {by} ({m(catalog.TRAIN_DATA_WAIT_RATIO)})"),
        record(catalog.REC_JOB_PEAK_MEMORY_BYTES_MAX, f"max {by} ({_rank_peak_memory()})"),
        record(catalog.REC_JOB_STEP_MAX, f"max {by} ({m(catalog.TRAIN_STEP)})"),
        record(catalog.REC_JOB_TOTAL_STEPS_MAX, f"max {by} ({m(catalog.TRAIN_TOTAL_STEPS)})"),
        record(catalog.REC_JOB_STEPS_PER_SECOND_RATE5M,
                f"max {by} (rate({m(catalog.TRAIN_STEPS_TOTAL)}[5m]))"),
        record(catalog.REC_JOB_ETA_SECONDS_ESTIMATE,
                f"({m(catalog.REC_JOB_TOTAL_STEPS_MAX)} - {m(catalog.REC_JOB_STEP_MAX)})"
                f" / ({m(catalog.REC_JOB_STEPS_PER_SECOND_RATE5M)} > 0)"),
    ]


def _rank_peak_memory() -> str:
    """Peak device memory per rank; process RSS for ranks without a device (CPU runs)."""
    active = m(catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES)
    rss = m(catalog.TRAIN_PROCESS_RSS_BYTES)
    return f"{active} or {rss}"


def gpu_records() -> list[Rule]:
    used, total = m(catalog.GPU_MEMORY_USED_BYTES), m(catalog.GPU_MEMORY_TOTAL_BYTES)
    pod_used = m(catalog.GPU_MEMORY_USED_BYTES, 'pod!=""')
    return [
        record(catalog.REC_NODE_GPU_UTILIZATION_RATIO_AVG,
                f"avg by (node) ({m(catalog.GPU_UTILIZATION_RATIO)})"),
        record(catalog.REC_NODE_GPU_MEMORY_USED_BYTES_SUM, f"sum by (node) ({used})"),
        record(catalog.REC_NODE_GPU_POWER_WATTS_SUM,
                f"sum by (node) ({m(catalog.GPU_POWER_WATTS)})"),
        # per process where the fsdpmon exporter sees processes; whole GPUs for dcgm-exporter
        record(catalog.REC_POD_GPU_MEMORY_USED_BYTES_SUM,
                f"sum by (node, namespace, pod) ({m(catalog.GPU_PROCESS_MEMORY_USED_BYTES)})\n"
                f"or sum by (node, namespace, pod) ({pod_used})"),
        record(catalog.REC_GPU_MEMORY_USED_BYTES_RATIO, f"{used} / ({total} > 0)"),
    ]


def _group(name: str, rules: list[Rule], interval: str) -> dict[str, Any]:
    return {"name": name, **({"interval": interval} if interval else {}), "rules": rules}


def rule_groups(bounds: RuleBounds | None = None,
                runbook_url: str = DEFAULT_RUNBOOK_URL) -> list[dict[str, Any]]:
    """Every rule group, in the order they are shipped; each alert's ``runbook_url`` is
    ``runbook_url#<cause>`` (ValueError for an address that cannot take a fragment)."""
    b = bounds or SHIPPED
    base = runbook_base(runbook_url)
    return [
        {"name": "fsdpmon-training.rules", "rules": training_records()},
        # records and the alerts that read them in one group: evaluated in order, so an alert
        # reads this evaluation's culprits (groups run apart, one an interval behind another);
        # its own interval, so a hang's page waits for no server-wide default
        _group(CULPRIT_GROUP, [*culprit_records(), *with_runbook(culprit_alerts(b), base)],
               b.culprit_interval),
        {"name": "fsdpmon-gpu.rules", "rules": gpu_records()},
        {"name": "fsdpmon-dcgm.rules", "rules": dcgm_rules(b.error_window)},
        {"name": "fsdpmon-training.alerts", "rules": with_runbook(training_alerts(b), base)},
        {"name": "fsdpmon-gpu.alerts", "rules": with_runbook(gpu_alerts(b), base)},
        {"name": "fsdpmon-targets.alerts", "rules": with_runbook(target_alerts(b), base)},
    ]


def recorded_names(groups: list[dict[str, Any]] | None = None) -> set[str]:
    """Names the rules record (the only non-catalog fsdpmon names dashboards may use)."""
    return {r["record"] for g in (groups or rule_groups()) for r in g["rules"] if "record" in r}


def alert_names(groups: list[dict[str, Any]] | None = None) -> list[str]:
    """Each alert's name once, in order (an alert whose severity depends on what raised it, the
    XID alert, is one rule per severity under one name)."""
    return list(dict.fromkeys(r["alert"] for g in (groups or rule_groups()) for r in g["rules"]
                              if "alert" in r))
