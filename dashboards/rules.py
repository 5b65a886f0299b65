"""Prometheus recording and alerting rules for FSDP jobs, built from the metric catalog.

``rule_groups()`` returns plain rule groups (only the keys promtool 2.42 accepts: ``name``,
``interval``, ``rules``), which ``python -m dashboards`` writes to
``dashboards/generated/fsdpmon-rules.yaml`` and the Kubernetes manifests wrap in a
PrometheusRule. Every threshold and ``for`` duration is a field of :class:`RuleBounds`, so the
end-to-end test can generate a fast variant while the shipped defaults suit real jobs; where the
runbook is published (each alert's ``runbook_url``) is ``rule_groups``' ``runbook_url``.

Recorded names follow ``level:metric:operations`` (``fsdpmon_job:tokens_per_second:sum``); each is
a :class:`fsdpmon.catalog.Recorded` symbol (``catalog.REC_JOB_TOKENS_PER_SECOND_SUM``), and this
module holds its expression. The dcgm-exporter group records catalogued GPU names instead, so
dashboards and alerts work on clusters that run dcgm-exporter instead of the fsdpmon exporter.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from dashboards.dcgm import dcgm_rules
from dashboards.promql import JOB_KEYS, m
from fsdpmon import catalog
from fsdpmon.catalog import Recorded
from fsdpmon.conventions import (
    DEFAULT_STALL_FACTOR,
    DEFAULT_STALL_FLOOR_SECONDS,
    MEMORY_PRESSURE_RATIO,
    STRAGGLER_SCORE_THRESHOLD,
)

Rule = dict[str, Any]

HEARTBEAT = m(catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS)
# Served from the monitor's start, before the first step completes: the "rank is alive" series.
AGE = m(catalog.TRAIN_HEARTBEAT_AGE_SECONDS)
STEP_TIME = m(catalog.TRAIN_STEP_TIME_SECONDS)


@dataclass(frozen=True)
class RuleBounds:
    """Alert thresholds and durations (Prometheus duration strings)."""

    # Stalled: no step for max(stall_factor x the rank's own mean step time, stall_floor).
    # The monitor's own stall flag uses the same defaults (FSDPMON_STALL_FACTOR / _FLOOR_SECONDS).
    stall_factor: float = DEFAULT_STALL_FACTOR
    stall_floor_seconds: float = DEFAULT_STALL_FLOOR_SECONDS
    stall_for: str = "2m"
    # A rank seen within this window whose series are gone while its pod/target is still there.
    missing_lookback: str = "15m"
    missing_for: str = "2m"
    target_down_for: str = "3m"
    exporter_down_for: str = "5m"
    # Straggler: the rank's score (median busy time of the other ranks / its own) below this.
    straggler_score: float = STRAGGLER_SCORE_THRESHOLD
    straggler_for: str = "15m"
    memory_ratio: float = MEMORY_PRESSURE_RATIO  # a rank's peak active memory / capacity
    memory_for: str = "5m"
    allocator_window: str = "15m"
    low_util_ratio: float = 0.30
    low_util_for: str = "20m"
    error_window: str = "15m"  # XID / ECC counters
    throttle_for: str = "10m"
    # ... or held down this share of the time by NVML's accumulated clock-event time, over
    # throttle_window (a flag sampled per scrape misses throttling that comes and goes)
    throttle_share: float = 0.25
    throttle_window: str = "5m"
    nonfinite_for: str = "1m"
    divergence_factor: float = 1.5  # loss above factor x its minimum over divergence_window
    divergence_window: str = "1h"
    divergence_for: str = "15m"
    throughput_drop_ratio: float = 0.6  # tokens/s below ratio x its own recent average
    throughput_window: str = "1h"
    throughput_for: str = "15m"


def _rose(series: str, window: str) -> str:
    """A counter that went up within ``window``, including one born within it above 0.

    ``increase()`` needs a baseline sample: a series whose first sample is already 1 (the
    exporter creates ``fsdpmon_gpu_xid_errors_total{xid="79"}`` on the first XID 79) has an
    increase of 0, so that first event would never alert. The second arm catches a series that
    is above 0 now and had no sample ``window`` ago, for as long as ``increase()`` would have.
    After a Prometheus restart an old non-zero counter counts as new for one window: a repeat
    notification, never a missed event.
    """
    return f"increase({series}[{window}]) > 0\nor\n({series} > 0 unless {series} offset {window})"


def _record(recorded: Recorded, expr: str) -> Rule:
    return {"record": recorded.name, "expr": expr}


# Where the runbook is published: docs/runbook.md of the fsdpmon repository, one `## <cause>`
# section per cause, so `<url>#<cause>` opens it. A team that hosts its own copy (a wiki, an
# internal Git server) generates the rules with its address: `python -m dashboards
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
    "FsdpmonTrainingStalled": "hang",
    "FsdpmonTrainingRankMissing": "rank_missing",
    "FsdpmonTrainingRanksShort": "rank_missing",
    "FsdpmonRankStraggling": "straggler_compute",
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


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str,
           hint: str) -> Rule:
    rule: Rule = {"alert": name, "expr": expr}
    if for_ not in ("", "0s"):
        rule["for"] = for_
    rule["labels"] = {"severity": severity}
    cause = ALERT_CAUSES[name]  # a new alert must say which cause it stands for
    # runbook_url is added by rule_groups(), which knows where the runbook is published
    rule["annotations"] = {"summary": summary, "description": description, "hint": hint,
                           "cause": cause}
    return rule


def _with_runbook(rules: list[Rule], base: str) -> list[Rule]:
    for rule in rules:
        if "alert" in rule:
            notes = rule["annotations"]
            notes["runbook_url"] = f"{base}#{notes['cause']}"
    return rules


def training_records() -> list[Rule]:
    """Job-level figures (one series per namespace/job_name) reused by dashboards and alerts."""
    by = f"by ({JOB_KEYS})"
    tps = m(catalog.TRAIN_TOKENS_PER_SECOND)
    return [
        _record(catalog.REC_JOB_TOKENS_PER_SECOND_SUM, f"sum {by} ({tps})"),
        _record(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG, f"avg {by} ({tps})"),
        _record(catalog.REC_JOB_RANKS_COUNT, f"count {by} ({AGE})"),
        _record(catalog.REC_JOB_HEARTBEAT_AGE_SECONDS_MAX, f"max {by} (time() - {HEARTBEAT})"),
        _record(catalog.REC_JOB_STEP_TIME_SECONDS_MAX, f"max {by} ({STEP_TIME})"),
        _record(catalog.REC_JOB_STEP_TIME_SECONDS_P50, f"quantile {by} (0.5, {STEP_TIME})"),
        _record(catalog.REC_JOB_MFU_RATIO_AVG, f"avg {by} ({m(catalog.TRAIN_MFU_RATIO)})"),
        _record(catalog.REC_JOB_LOSS_AVG, f"avg {by} ({m(catalog.TRAIN_LOSS)})"),
        _record(catalog.REC_JOB_LOSS_MAX, f"max {by} ({m(catalog.TRAIN_LOSS)})"),
        _record(catalog.REC_JOB_DATA_WAIT_RATIO_MAX,
                f"max {by} ({m(catalog.TRAIN_DATA_WAIT_RATIO)})"),
        _record(catalog.REC_JOB_PEAK_MEMORY_BYTES_MAX, f"max {by} ({_rank_peak_memory()})"),
        _record(catalog.REC_JOB_STEP_MAX, f"max {by} ({m(catalog.TRAIN_STEP)})"),
        _record(catalog.REC_JOB_TOTAL_STEPS_MAX, f"max {by} ({m(catalog.TRAIN_TOTAL_STEPS)})"),
        _record(catalog.REC_JOB_STEPS_PER_SECOND_RATE5M,
                f"max {by} (rate({m(catalog.TRAIN_STEPS_TOTAL)}[5m]))"),
        _record(catalog.REC_JOB_ETA_SECONDS_ESTIMATE,
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
        _record(catalog.REC_NODE_GPU_UTILIZATION_RATIO_AVG,
                f"avg by (node) ({m(catalog.GPU_UTILIZATION_RATIO)})"),
        _record(catalog.REC_NODE_GPU_MEMORY_USED_BYTES_SUM, f"sum by (node) ({used})"),
        _record(catalog.REC_NODE_GPU_POWER_WATTS_SUM,
                f"sum by (node) ({m(catalog.GPU_POWER_WATTS)})"),
        # per process where the fsdpmon exporter sees processes; whole GPUs for dcgm-exporter
        _record(catalog.REC_POD_GPU_MEMORY_USED_BYTES_SUM,
                f"sum by (node, namespace, pod) ({m(catalog.GPU_PROCESS_MEMORY_USED_BYTES)})\n"
                f"or sum by (node, namespace, pod) ({pod_used})"),
        _record(catalog.REC_GPU_MEMORY_USED_BYTES_RATIO, f"{used} / ({total} > 0)"),
    ]


def _stall(b: RuleBounds) -> Rule:
    floor = f"{b.stall_floor_seconds:g}"
    bound = (f"clamp_min({b.stall_factor:g} * {STEP_TIME}, {floor})"
             f" or ({AGE} * 0 + {floor})")  # before the first log window: the floor only
    # Before the first step there is no timestamp; the age then counts from the monitor's start.
    return _alert(
        "FsdpmonTrainingStalled",
        f"((time() - {HEARTBEAT}) or {AGE})\n  > ({bound})",
        b.stall_for, "critical",
        "Training job {{ $labels.job_name }} rank {{ $labels.rank }} has stopped making progress",
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} completed no optimiser step for "
        "{{ $value | humanizeDuration }}, more than max(" + f"{b.stall_factor:g}"
        + " x its mean step time, " + floor + "s).",
        "A hang in a collective (NCCL/gloo) stops every rank at once: find the rank that "
        "stopped first (`fsdpmon top --job NAME`), then check its pod's logs, py-spy dump, "
        "GPU XID errors and the node's network (EFA). A stopped data loader or a full disk "
        "during checkpointing stalls one rank first.",
    )


def _rank_missing(b: RuleBounds) -> Rule:
    keys = "instance, job, namespace, pod, job_name, rank"
    step, total = m(catalog.TRAIN_STEP), m(catalog.TRAIN_TOTAL_STEPS)
    lb = b.missing_lookback
    seen = f"group by ({keys}) (max_over_time({AGE}[{lb}]))"
    finished = (f"(max_over_time({step}[{lb}]) >= max_over_time({total}[{lb}]))")
    missing = (f"({seen}\n    unless on (instance, job_name, rank) {AGE}\n"
               f"    unless on (instance, job_name, rank) {finished})")
    live_pod = ('(kube_pod_info unless on (namespace, pod) '
                '(kube_pod_status_phase{phase=~"Succeeded|Failed"} == 1))')
    expr = (f"({missing}\n  and on (instance, job) (up == 1))\nor\n"
            f"({missing}\n  and on (namespace, pod) {live_pod})")
    return _alert(
        "FsdpmonTrainingRankMissing", expr, b.missing_for, "critical",
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} stopped reporting while its pod "
        "still exists",
        "The training series of rank {{ $labels.rank }} {{ if $labels.pod }}(pod "
        "{{ $labels.namespace }}/{{ $labels.pod }}) {{ end }}vanished from "
        "{{ $labels.instance }} before its last step, although its pod still runs or the "
        "endpoint still serves the other ranks.",
        "The rank's process died or hung so hard it cannot be scraped: check the pod's "
        "container restarts and logs (OOMKilled, segfault, NCCL error) and `dmesg` for XIDs.",
    )


def _straggler(b: RuleBounds) -> Rule:
    # Step time cannot name a straggler (in synchronous training every rank's step is as long
    # as the slowest one's); the score does: the straggler is the rank that waits least at the
    # collectives, i.e. is busy longest. It covers slow compute and slow data loading alike.
    score = m(catalog.TRAIN_STRAGGLER_SCORE)
    return _alert(
        "FsdpmonRankStraggling", f"{score} < {b.straggler_score:g}", b.straggler_for, "warning",
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} is straggling",
        "Rank {{ $labels.rank }} has straggler score {{ $value | printf \"%.2f\" }} (the other "
        f"ranks' median busy time over its own; below {b.straggler_score:g}): it waits least "
        "at the collectives, and every other rank waits for it at each one.",
        "Compare the rank's phases on the Ranks dashboard: a long data phase points at its "
        "data loader or storage; slow forward/backward at a throttled or faulty GPU (see the "
        "Nodes dashboard for its clocks, temperature and XIDs) or a noisy neighbour on the node.",
    )


def _ranks_short(b: RuleBounds) -> Rule:
    """Ranks that never reported are not caught by the rule above (nothing vanished): e.g. a
    pod whose endpoint another job took, or a pod that never started."""
    by = f"by ({JOB_KEYS})"
    expr = (f"max {by} ({m(catalog.JOB_WORLD_SIZE)})\n"
            f"  > count {by} ({AGE})")
    return _alert(
        "FsdpmonTrainingRanksShort", expr, b.missing_for, "critical",
        "Fewer ranks of {{ $labels.job_name }} report than its world size",
        "The job has {{ $value }} ranks, but fewer of them are scraped: a pod's endpoint is "
        "not scraped, serves another job, or the pod never started.",
        "List the ranks that report (`fsdpmon top --job NAME` names the ones never seen), "
        "then check the missing ranks' pods: Pending, crash-looping, or their metrics port "
        "taken by another process (the trainer's log says so at start).",
    )


def training_alerts(b: RuleBounds) -> list[Rule]:
    return [_stall(b), _rank_missing(b), _ranks_short(b), _straggler(b), *_quality_alerts(b),
            *_memory_alerts(b)]


def _quality_alerts(b: RuleBounds) -> list[Rule]:
    job_tps = m(catalog.REC_JOB_TOKENS_PER_SECOND_SUM)
    loss = m(catalog.REC_JOB_LOSS_AVG)
    return [
        _alert(
            "FsdpmonLossNonFinite", f"{m(catalog.TRAIN_LOSS_NONFINITE)} == 1",
            b.nonfinite_for, "critical",
            "Loss of {{ $labels.job_name }} is NaN or infinite on rank {{ $labels.rank }}",
            "The last logged loss of rank {{ $labels.rank }} was not finite; the run is "
            "wasting compute from here on.",
            "Check the learning rate and warm-up, the grad norm just before (Job overview), "
            "mixed-precision settings and the batch that was loaded; resume from the last good "
            "checkpoint with a lower LR or skip the bad data.",
        ),
        _alert(
            "FsdpmonLossDiverging",
            f"{loss}\n  > {b.divergence_factor:g} * min_over_time({loss}[{b.divergence_window}])",
            b.divergence_for, "warning",
            "Loss of {{ $labels.job_name }} is diverging",
            "The mean loss is {{ $value | printf \"%.3g\" }}, more than "
            f"{b.divergence_factor:g} x its minimum over the last {b.divergence_window}.",
            "Look for grad-norm spikes and LR schedule changes on the Job overview dashboard; "
            "a restart from a checkpoint with new data order or lower LR usually helps.",
        ),
        _alert(
            "FsdpmonThroughputDropped",
            f"{job_tps}\n  < {b.throughput_drop_ratio:g} * avg_over_time({job_tps}"
            f"[{b.throughput_window}] offset {b.throughput_for})",
            b.throughput_for, "warning",
            "Throughput of {{ $labels.job_name }} dropped",
            "The job processes {{ $value | humanize }} tokens/s, less than "
            f"{b.throughput_drop_ratio:g} x its own average over the {b.throughput_window} "
            "before.",
            "Find what changed: a straggling rank (Ranks dashboard), GPU throttling or XIDs "
            "(Nodes dashboard), data wait rising, checkpoint phases growing, or a restart onto "
            "fewer or slower nodes.",
        ),
    ]


def _memory_alerts(b: RuleBounds) -> list[Rule]:
    peak = m(catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES)
    cap = m(catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES)
    w = b.allocator_window
    return [
        _alert(
            "FsdpmonGPUMemoryNearCapacity",
            # Peak *active* memory, not what the GPU reports used: PyTorch's caching allocator
            # keeps most of the device reserved in a healthy run.
            f"{peak} / ({cap} > 0) > {b.memory_ratio:g}",
            b.memory_for, "warning",
            "Device memory near capacity on rank {{ $labels.rank }} of {{ $labels.job_name }}",
            "Peak active memory reached {{ $value | humanizePercentage }} of the device; the "
            "next larger batch, sequence or checkpoint may run out of memory.",
            "Reduce the micro-batch or sequence length, enable activation checkpointing or CPU "
            "offload, or shard over more ranks; check for fragmentation (reserved far above "
            "active on the Ranks dashboard).",
        ),
        _alert(
            "FsdpmonAllocatorRetries",
            f"{_rose(m(catalog.TRAIN_ALLOC_RETRIES_TOTAL), w)}\nor\n"
            f"{_rose(m(catalog.TRAIN_OOMS_TOTAL), w)}",
            "", "warning",
            "CUDA allocator retries or OOMs on {{ $labels.job_name }} rank {{ $labels.rank }}",
            f"The caching allocator had to free its cache and retry (or hit OOM) in the last {w}; "
            "each retry synchronises the device and slows every rank.",
            "Memory is at the limit: lower the micro-batch or sequence length, enable activation "
            "checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
            "fragmentation.",
        ),
    ]


def gpu_alerts(b: RuleBounds) -> list[Rule]:
    return [*_gpu_use_alerts(b), *_gpu_fault_alerts(b)]


def _gpu_use_alerts(b: RuleBounds) -> list[Rule]:
    # Power capping (sw_power_cap) is routine under full load; these reasons cost clock speed
    # because something is wrong with cooling or power delivery.
    hot = "sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown|hw_slowdown"
    throttled = m(catalog.GPU_CLOCK_EVENT_ACTIVE, f'reason=~"{hot}"')
    held = m(catalog.GPU_CLOCK_EVENT_SECONDS_TOTAL, f'reason=~"{hot}"')
    share = f"{b.throttle_share:.0%}"
    return [
        _alert(
            "FsdpmonGPULowUtilization",
            f"{m(catalog.REC_NODE_GPU_UTILIZATION_RATIO_AVG)} < {b.low_util_ratio:g}\n"
            f"  and on (node) group by (node) ({m(catalog.TRAIN_INFO)})",
            b.low_util_for, "warning",
            "GPUs of node {{ $labels.node }} are mostly idle while training runs there",
            "Average GPU utilisation on {{ $labels.node }} is {{ $value | humanizePercentage }} "
            "while a training rank runs on the node.",
            "Check data wait and step phases on the Ranks dashboard (input pipeline, CPU "
            "offload, checkpointing), and whether the job is stalled.",
        ),
        _alert(
            "FsdpmonGPUThrottling",
            f"{throttled} == 1\nor\n"
            f"rate({held}[{b.throttle_window}]) > {b.throttle_share:g}",
            b.throttle_for, "warning",
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} is throttled ({{ $labels.reason }})",
            "Clock-event reason {{ $labels.reason }} has held the clocks down for "
            + b.throttle_for + f" (active, or over {share} of the time); a throttled GPU makes "
            "its rank a straggler.",
            "Check the GPU's temperature and power on the Nodes dashboard, the node's cooling "
            "and power supply; hw_slowdown with normal temperature can mean a failing board.",
        ),
    ]


def _gpu_fault_alerts(b: RuleBounds) -> list[Rule]:
    w = b.error_window
    uncorrected = m(catalog.GPU_ECC_ERRORS_TOTAL, 'type="uncorrected"')
    failed_remap = m(catalog.GPU_REMAPPED_ROWS, 'cause="failure"')
    return [
        _alert(
            "FsdpmonGPUXidErrors",
            f"{_rose(m(catalog.GPU_XID_ERRORS_TOTAL), w)}\nor\n"
            f"{m(catalog.REC_GPU_DCGM_XID_ERRORS_CHANGES)} > 0",
            "", "critical",
            "XID errors on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported "
            "{{ with $labels.xid }}XID {{ . }}{{ else }}XID errors{{ end }} in the "
            f"last {w}.",
            "Look the XID code up in NVIDIA's XID catalogue: 79 (fallen off the bus), 48/63/64 "
            "(ECC) and 94/95 (contained/uncontained memory errors) usually mean draining the "
            "node and a GPU reset or RMA; 13/31/43 often come from the application.",
        ),
        _alert(
            "FsdpmonGPUEccErrors",
            f"{_rose(uncorrected, w)}\nor\n{failed_remap} > 0",
            "", "critical",
            "Uncorrectable memory errors on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported uncorrectable ECC errors or a "
            "failed row remapping.",
            "Drain the node; the GPU needs a reset to remap rows, or replacement if remapping "
            "failed.",
        ),
    ]


def target_alerts(b: RuleBounds) -> list[Rule]:
    lb = b.missing_lookback
    train = m(catalog.TRAIN_INFO)
    exporter = m(catalog.EXPORTER_INFO)
    stale = m(catalog.EXPORTER_SAMPLE_STALE)
    return [
        _alert(
            "FsdpmonTrainingTargetDown",
            "(up == 0)\n  * on (instance, job) group_left (job_name)\n"
            f"  group by (instance, job, job_name) (max_over_time({train}[{lb}]))",
            b.target_down_for, "critical",
            "Training metrics endpoint {{ $labels.instance }} of {{ $labels.job_name }} is down",
            "Prometheus cannot scrape {{ $labels.instance }}, which served training metrics "
            f"within the last {lb}.",
            "The pod may have crashed or be hung in a way that blocks its metrics thread; "
            "check the pod status, restarts and logs, and the PodMonitor/port (fsdpmon-train).",
        ),
        _alert(
            "FsdpmonExporterDown",
            "((up == 0)\n  and on (instance, job)\n"
            f"  group by (instance, job) (max_over_time({exporter}[{lb}])))\nor\n"
            f"{stale} == 1",
            b.exporter_down_for, "warning",
            "fsdpmon exporter {{ $labels.instance }} is down or stale",
            "The per-node exporter cannot be scraped, or its background sampler has not "
            "finished a sample in time; GPU, host and process metrics of the node are missing.",
            "Check the exporter DaemonSet pod on the node (logs, restarts, resource limits) "
            "and whether NVML answers there (`nvidia-smi`).",
        ),
    ]


def rule_groups(bounds: RuleBounds | None = None,
                runbook_url: str = DEFAULT_RUNBOOK_URL) -> list[dict[str, Any]]:
    """Every rule group, in the order they are shipped; each alert's ``runbook_url`` is
    ``runbook_url#<cause>`` (ValueError for an address that cannot take a fragment)."""
    b = bounds or RuleBounds()
    base = runbook_base(runbook_url)
    return [
        {"name": "fsdpmon-training.rules", "rules": training_records()},
        {"name": "fsdpmon-gpu.rules", "rules": gpu_records()},
        {"name": "fsdpmon-dcgm.rules", "rules": dcgm_rules(b.error_window)},
        {"name": "fsdpmon-training.alerts", "rules": _with_runbook(training_alerts(b), base)},
        {"name": "fsdpmon-gpu.alerts", "rules": _with_runbook(gpu_alerts(b), base)},
        {"name": "fsdpmon-targets.alerts", "rules": _with_runbook(target_alerts(b), base)},
    ]


def recorded_names(groups: list[dict[str, Any]] | None = None) -> set[str]:
    """Names the rules record (the only non-catalog fsdpmon names dashboards may use)."""
    return {r["record"] for g in (groups or rule_groups()) for r in g["rules"] if "record" in r}


def alert_names(groups: list[dict[str, Any]] | None = None) -> list[str]:
    return [r["alert"] for g in (groups or rule_groups()) for r in g["rules"] if "alert" in r]
