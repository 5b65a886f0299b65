"""Alerting rules for the GPUs under an FSDP job: their use (idle, throttled) and their faults
(lost, XID, ECC), each named with the training rank whose process uses the GPU where known.
Every threshold and ``for`` is a field of :class:`fsdpmon.dashboards.rulebase.RuleBounds`."""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.conventions import GPU_THROTTLE_REASONS, GPU_XID_CRITICAL, THROTTLE_SEVERITY
from fsdpmon.dashboards.promql import m
from fsdpmon.dashboards.rulebase import Rule, RuleBounds, alert, by_severity, rose


def gpu_alerts(b: RuleBounds) -> list[Rule]:
    return [*_gpu_use_alerts(b), *_gpu_fault_alerts(b)]


def _gpu_use_alerts(b: RuleBounds) -> list[Rule]:
    return [
        alert(
            "FsdpmonGPULowUtilization",
            f"{m(catalog.REC_NODE_GPU_UTILIZATION_RATIO_AVG)} < {b.low_util_ratio:g}\n"
            f"  and on (node) group by (node) ({m(catalog.TRAIN_INFO)})",
            b.low_util_for,
            "GPUs of node {{ $labels.node }} are mostly idle while training runs there",
            "Average GPU utilisation on {{ $labels.node }} is {{ $value | humanizePercentage }} "
            "while a training rank runs on the node.",
            "Check data wait and step phases on the Ranks dashboard (input pipeline, CPU "
            "offload, checkpointing), and whether the job is stalled.",
        ),
        *(_throttling(b, reasons) for reasons in by_severity(
            {r: THROTTLE_SEVERITY[r] for r in GPU_THROTTLE_REASONS}).values()),
    ]


def _throttling(b: RuleBounds, reasons: list[str]) -> Rule:
    """Throttling by ``reasons`` (of one severity). Power capping (sw_power_cap) is routine
    under full load: only the reasons that cost clock speed because something is wrong with
    cooling or power delivery (GPU_THROTTLE_REASONS) page."""
    hot = "|".join(reasons)
    throttled = m(catalog.GPU_CLOCK_EVENT_ACTIVE, f'reason=~"{hot}"')
    held = m(catalog.GPU_CLOCK_EVENT_SECONDS_TOTAL, f'reason=~"{hot}"')
    share = f"{b.throttle_share:.0%}"
    return alert(
        "FsdpmonGPUThrottling",
        with_rank(f"{throttled} == 1\nor\n"
                  f"rate({held}[{b.throttle_window}]) > {b.throttle_share:g}", b),
        b.throttle_for,
        "GPU {{ $labels.gpu }} of node {{ $labels.node }} is throttled ({{ $labels.reason }})",
        "Clock-event reason {{ $labels.reason }} has held the clocks down for "
        + b.throttle_for + f" (active, or over {share} of the time); a throttled GPU makes "
        "its rank a straggler.",
        "Check the GPU's temperature and power on the Nodes dashboard, the node's cooling "
        "and power supply; hw_slowdown with normal temperature can mean a failing board.",
        detail=reasons[0],
    )


def _gpu_owner(b: RuleBounds) -> str:
    """Per GPU, one training rank whose worker process uses it (the exporter reads the worker's
    RANK), valued 0: added to a GPU alert's expression, it names the rank the GPU fault hits.
    One per GPU (topk): a GPU two ranks share names one of them rather than failing the join."""
    info = m(catalog.PROCESS_INFO, 'rank!=""')
    workers = f"last_over_time({info}[{b.gpu_owner_window}])"
    # over a window: a lost GPU serves no process samples, but its rank is still the one
    used = (f"last_over_time({m(catalog.GPU_PROCESS_MEMORY_USED_BYTES)}"
            f"[{b.gpu_owner_window}]) * 0\n    + on (node, pid) group_left (rank) {workers}")
    return f"topk by (node, gpu) (1, max by (node, gpu, rank) (\n    {used}))"


def with_rank(expr: str, b: RuleBounds) -> str:
    """A GPU alert's ``expr`` with the ``rank`` of the GPU's training process where known, as
    it is where not."""
    owner = _gpu_owner(b)
    return (f"(\n{expr}\n) + on (node, gpu) group_left (rank) {owner}\nor\n"
            f"(\n{expr}\n) unless on (node, gpu) {owner}")


def _gpu_fault_alerts(b: RuleBounds) -> list[Rule]:
    w = b.error_window
    uncorrected = m(catalog.GPU_ECC_ERRORS_TOTAL, 'type="uncorrected"')
    failed_remap = m(catalog.GPU_REMAPPED_ROWS, 'cause="failure"')
    lost = f"{m(catalog.GPU_UP)} == 0"
    # an XID that comes with uncorrectable ECC errors on its GPU (48, 63, 94/95) pages as ECC
    ecc = f"{rose(uncorrected, w)}\nor\n{failed_remap} > 0"
    return [
        alert(
            "FsdpmonGPULost", with_rank(lost, b), b.gpu_lost_for,
            "GPU {{ $labels.gpu }} of node {{ $labels.node }} is lost"
            "{{ if $labels.rank }} under rank {{ $labels.rank }}{{ end }}",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) stopped answering NVML (fallen off the "
            "bus, or the driver lost it){{ if $labels.rank }}; rank {{ $labels.rank }} ran on "
            "it{{ end }}.",
            "Cordon and drain the node and replace the instance; the job restarts elsewhere "
            "from its last checkpoint.",
        ),
        *_xid_alerts(b, lost, ecc),
        alert(
            "FsdpmonGPUEccErrors",
            with_rank(ecc, b),
            "",
            "Uncorrectable memory errors on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported uncorrectable ECC errors or a "
            "failed row remapping.",
            "Drain the node; the GPU needs a reset to remap rows, or replacement if remapping "
            "failed.",
        ),
    ]


def _xids(critical: bool, w: str) -> str:
    """XIDs within ``w`` whose code is (or is not) in GPU_XID_CRITICAL: the fsdpmon exporter's
    per-code counters, and dcgm-exporter's last code where it changed."""
    codes = "|".join(str(code) for code in GPU_XID_CRITICAL)
    ours = m(catalog.GPU_XID_ERRORS_TOTAL, f'xid{"=~" if critical else "!~"}"{codes}"')
    last = m(catalog.REC_GPU_DCGM_XID_ERRORS_LAST)
    is_critical = " or ".join(f"{last} == {code}" for code in GPU_XID_CRITICAL)
    dcgm = (f"{m(catalog.REC_GPU_DCGM_XID_ERRORS_CHANGES)} > 0\n"
            f"  {'and' if critical else 'unless'} on (node, gpu) ({is_critical})")
    return f"{rose(ours, w)}\nor\n({dcgm})"


def _xid_alerts(b: RuleBounds, lost: str, ecc: str) -> list[Rule]:
    """One alert name, one rule per severity (xid_severity): the codes that mean draining the
    node page as critical, the others (13, 31, 43: often the application's) as warnings."""
    w = b.error_window
    rules = []
    for critical, code in ((True, GPU_XID_CRITICAL[0]), (False, None)):
        rules.append(alert(
            "FsdpmonGPUXidErrors",
            with_rank(f"({_xids(critical, w)})\nunless on (node, gpu) ({lost})\n"
                      f"unless on (node, gpu) ({ecc})", b),
            "",
            "XID errors on GPU {{ $labels.gpu }} of node {{ $labels.node }}",
            "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) reported "
            "{{ with $labels.xid }}XID {{ . }}{{ else }}XID errors{{ end }} in the "
            f"last {w}.",
            "Look the XID code up in NVIDIA's XID catalogue: 79 (fallen off the bus), 48/63/64 "
            "(ECC) and 94/95 (contained/uncontained memory errors) usually mean draining the "
            "node and a GPU reset or RMA; 13/31/43 often come from the application.",
            detail=None if code is None else str(code),
        ))
    return rules
