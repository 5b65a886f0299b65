"""Catalog-shaped expositions of a synthetic job, rendered by prometheus_client itself.

Tests, the benchmark and stand-in servers serve these so that `top` reads the same text format,
names and labels a real monitor and exporter produce, without a GPU or a cluster. It encodes with
the endpoints' own encoder (fsdpmon.families). Test and benchmark code only: it lives in tests/,
not in the product package (benchmarks put tests/ on their import path).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from fsdpmon import catalog
from fsdpmon.conventions import (
    SIMULATED_GPU_MODEL,
    STRAGGLER_SCORE_THRESHOLD,
    clock_event_mask,
)
from fsdpmon.families import Families


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int = 0
    node: str = "node-0"
    step: int = 100
    total_steps: int | None = 1000
    step_time_s: float = 0.5
    data_wait_ratio: float = 0.02
    tokens_per_second: float = 8192.0
    mfu_ratio: float | None = 0.41
    loss: float = 2.5
    peak_memory_bytes: float = 40e9
    memory_capacity_bytes: float = 80e9
    heartbeat_age_s: float = 0.2
    stall_threshold_s: float = 30.0
    stalled: bool = False
    world_size: int = 1
    nodes: int = 1
    busy_s: float | None = None  # None: step time x (1 - collective wait)
    collective_wait_ratio: float = 0.1
    straggler_score: float = 1.0
    straggling: bool | None = None  # None: as the monitor settles, score below the line
    waited_for_score: float = 1.0
    descheduled_ratio: float = 0.05  # share of the step waiting for a CPU
    cpu_throttled_ratio: float = 0.0
    unresponsive: bool = False
    loss_nonfinite: bool = False
    loss_first_nonfinite_step: int | None = None  # None: not yet (no series)
    grad_norm_first_nonfinite_step: int | None = None
    checkpoint_s: float = 0.0  # per-step checkpoint phase time
    checkpoint_seconds: float | None = None  # the last save (None: no save yet, no series)
    checkpoint_own_seconds: float | None = None
    checkpoint_time_ratio: float | None = None
    restarts: int = 0
    # How its previous incarnation ended ("" on a first start: no series), at which step and
    # when (unix), as a restarted rank's monitor serves it.
    previous_exit: str = ""
    previous_exit_step: int | None = None
    previous_exit_unix: float | None = None
    # The progress evidence, by metric name (the collective entered and completed, inside one,
    # since when, the last step's time, the published stall bound); a metric left out is
    # served as 1.0 like any other the spec leaves open, one given None not at all.
    # ``phase``: the phase gauge is 1 for this phase and 0 for the others (None: 1 for all).
    progress: tuple[tuple[str, float | None], ...] = ()
    phase: str | None = None


@dataclass(frozen=True)
class GpuSpec:
    gpu: int
    utilization_ratio: float = 0.97
    memory_used_bytes: float = 60e9
    memory_total_bytes: float = 80e9
    temperature_celsius: float = 64.0
    power_watts: float = 550.0
    pod: str = ""
    pid: int = 0
    rank: int | None = None  # the training rank of the process on it (its RANK)
    up: bool = True
    clock_events: tuple[str, ...] = ()  # active clock-event reasons
    xids: tuple[tuple[int, int], ...] = ()  # (XID code, count)
    ecc_uncorrected: int = 0


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def _render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))  # type: ignore[arg-type]
    return generate_latest(registry)


# Values for the extra label dimensions the catalog declares (one series per value).
_DIMENSIONS = {
    "phase": ("data", "forward", "backward", "optimizer", "checkpoint"),
    "reason": ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
               "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
               "hw_power_brake_slowdown", "display_clock_setting"),
    "cause": ("correctable", "uncorrectable", "pending", "failure"),
    "direction": ("tx", "rx"),
    "type": ("corrected", "uncorrected"),
    "mode": ("user", "system", "idle", "iowait"),
    "source": ("nvml", "processes", "host", "pods"),
}
HOST_CORES = 96  # per-core CPU series, as on a p4d/p5 node

_RANK_FIELDS = {
    catalog.TRAIN_STEP.name: "step",
    catalog.TRAIN_STEPS_TOTAL.name: "step",
    catalog.TRAIN_TOTAL_STEPS.name: "total_steps",
    catalog.TRAIN_STEP_TIME_SECONDS.name: "step_time_s",
    catalog.TRAIN_DATA_WAIT_RATIO.name: "data_wait_ratio",
    catalog.TRAIN_TOKENS_PER_SECOND.name: "tokens_per_second",
    catalog.TRAIN_MFU_RATIO.name: "mfu_ratio",
    catalog.TRAIN_LOSS.name: "loss",
    catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name: "peak_memory_bytes",
    catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name: "memory_capacity_bytes",
    catalog.TRAIN_HEARTBEAT_AGE_SECONDS.name: "heartbeat_age_s",
    catalog.TRAIN_STALL_THRESHOLD_SECONDS.name: "stall_threshold_s",
    catalog.TRAIN_STALLED.name: "stalled",
    catalog.TRAIN_COLLECTIVE_WAIT_RATIO.name: "collective_wait_ratio",
    catalog.TRAIN_STRAGGLER_SCORE.name: "straggler_score",
    catalog.TRAIN_WAITED_FOR_SCORE.name: "waited_for_score",
    catalog.TRAIN_DESCHEDULED_RATIO.name: "descheduled_ratio",
    catalog.TRAIN_CPU_THROTTLED_RATIO.name: "cpu_throttled_ratio",
    catalog.TRAIN_UNRESPONSIVE.name: "unresponsive",
    catalog.TRAIN_LOSS_NONFINITE.name: "loss_nonfinite",
    catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP.name: "loss_first_nonfinite_step",
    catalog.TRAIN_GRAD_NORM_FIRST_NONFINITE_STEP.name: "grad_norm_first_nonfinite_step",
    catalog.TRAIN_RESTARTS.name: "restarts",
    catalog.TRAIN_PREVIOUS_EXIT_STEP.name: "previous_exit_step",
    catalog.TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS.name: "previous_exit_unix",
    catalog.TRAIN_CHECKPOINT_SECONDS.name: "checkpoint_seconds",
    catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name: "checkpoint_own_seconds",
    catalog.TRAIN_CHECKPOINT_TIME_RATIO.name: "checkpoint_time_ratio",
}
_GPU_FIELDS = {
    catalog.GPU_UTILIZATION_RATIO.name: "utilization_ratio",
    catalog.GPU_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.GPU_MEMORY_TOTAL_BYTES.name: "memory_total_bytes",
    catalog.GPU_TEMPERATURE_CELSIUS.name: "temperature_celsius",
    catalog.GPU_POWER_WATTS.name: "power_watts",
    catalog.GPU_PROCESS_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.GPU_UP.name: "up",
    catalog.GPU_ECC_ERRORS_TOTAL.name: "ecc_uncorrected",
}
_FIXED = {  # everything else a healthy node reports
    catalog.GPU_POWER_LIMIT_WATTS.name: 700.0, catalog.HOST_MEMORY_TOTAL_BYTES.name: 2e12,
    catalog.HOST_MEMORY_USED_BYTES.name: 5e11, catalog.HOST_MEMORY_AVAILABLE_BYTES.name: 1.5e12,
    catalog.HOST_LOAD1.name: 12.0, catalog.PROCESS_CPU_UTILIZATION_RATIO.name: 1.0,
    catalog.PROCESS_RESIDENT_MEMORY_BYTES.name: 12e9, catalog.TRAIN_RESTARTS.name: 0.0,
    catalog.MONITOR_INTERNAL_ERRORS_TOTAL.name: 0.0, catalog.GPU_ECC_ERRORS_TOTAL.name: 0.0,
    catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name: STRAGGLER_SCORE_THRESHOLD,  # the monitor's line
    # no allocator retries, no OOMs, no rows remapped for a failure: the alert rules page on
    # any (benchmarks/bench_page_scale.py runs them on this job)
    catalog.TRAIN_ALLOC_RETRIES_TOTAL.name: 0.0, catalog.TRAIN_OOMS_TOTAL.name: 0.0,
    catalog.GPU_REMAPPED_ROWS.name: 0.0,
}


def _expand(metric: catalog.Metric, known: dict[str, str]) -> list[list[str]]:
    """Label value lists for one metric: known labels filled in, dimensions expanded."""
    rows: list[list[str]] = [[]]
    for label in metric.labels:
        values = _DIMENSIONS.get(label, (known.get(label, ""),))
        rows = [[*row, v] for row in rows for v in values]
    return rows


def _add(fams: Families, metric: catalog.Metric, known: dict[str, str],
         value: float, per: dict[str, float] | None = None) -> None:
    """``per`` overrides the value by the series' last label value (a phase, a reason)."""
    for values in _expand(metric, known):
        fams.add(metric, values, (per or {}).get(values[-1], value) if values else value)


def _rank_value(metric: catalog.Metric, r: RankSpec) -> float | None:
    progress = dict(r.progress)
    if metric.name in progress:
        return progress[metric.name]
    attr = _RANK_FIELDS.get(metric.name)
    if attr is not None:
        value = getattr(r, attr)
        return None if value is None else float(value)
    if metric is catalog.TRAIN_PHASE_SECONDS_TOTAL:
        return r.step * r.step_time_s / 5
    if metric is catalog.TRAIN_STRAGGLING:
        return float(r.straggling if r.straggling is not None
                     else r.straggler_score < STRAGGLER_SCORE_THRESHOLD)
    if metric is catalog.TRAIN_GOODPUT_RATIO:  # the job's, served by rank 0 only
        return 0.874 if r.rank == 0 else None
    if metric is catalog.TRAIN_BUSY_SECONDS:
        return r.busy_s if r.busy_s is not None else r.step_time_s * (1 - r.collective_wait_ratio)
    return _FIXED.get(metric.name, 1.0)


def training_exposition(
    job: str, ranks: Sequence[RankSpec], job_ranks: Sequence[RankSpec] = ()
) -> bytes:
    """One training pod's /metrics: every local rank's series, as the monitor serves them.

    Every per-rank metric of the catalog is present (a histogram of step durations too). The
    pod holding rank 0 also carries the job-level series, computed over ``job_ranks`` (all
    ranks of the job; the pod's own ranks when not given).
    """
    fams = Families()
    for r in ranks:
        known = {"job_name": job, "rank": str(r.rank), "local_rank": str(r.local_rank),
                 "model": "llama2-7b", "world_size": str(r.world_size), "nodes": str(r.nodes),
                 "dtype": "bfloat16", "torch_version": "2.13.0", "node": r.node,
                 "device": "NVIDIA H100 80GB HBM3"}
        for metric in catalog.TRAINING:
            if "rank" not in metric.labels:
                continue
            if metric.kind is catalog.Kind.HISTOGRAM:
                buckets = [(str(b), float(r.step if b >= r.step_time_s else 0))
                           for b in metric.buckets] + [("+Inf", float(r.step))]
                fams.histogram(metric, _expand(metric, known)[0], buckets, r.step * r.step_time_s)
                continue
            value = _rank_value(metric, r)
            if metric is catalog.TRAIN_PREVIOUS_EXIT:
                if r.previous_exit:
                    fams.add(metric, [*_expand(metric, known)[0][:-1], r.previous_exit], 1.0)
            elif metric is catalog.TRAIN_PHASE and r.phase is not None:
                _add(fams, metric, known, 0.0, {r.phase: 1.0})
            elif metric is catalog.TRAIN_PHASE_DURATION_SECONDS:
                _add(fams, metric, known, r.step_time_s / 5, {"checkpoint": r.checkpoint_s})
            elif value is not None:
                _add(fams, metric, known, value)
    if ranks and ranks[0].rank == 0:
        for name, value in _job_values(job_ranks or ranks).items():
            _add(fams, catalog.get(name), {"job_name": job}, value)
    return _render(fams.families())


def _job_values(ranks: Sequence[RankSpec]) -> dict[str, float]:
    times = sorted(r.step_time_s for r in ranks)
    slowest = min(ranks, key=lambda r: (r.straggler_score, -r.step_time_s))  # as the monitor
    heaviest = max(ranks, key=lambda r: r.peak_memory_bytes)
    values = {m.name: 1.0 for m in catalog.TRAINING if m.labels == ("job_name",)}
    values.update({
        catalog.JOB_STEP_TIME_MIN_SECONDS.name: times[0],
        catalog.JOB_STEP_TIME_MEDIAN_SECONDS.name: times[len(times) // 2],
        catalog.JOB_STEP_TIME_MAX_SECONDS.name: times[-1],
        catalog.JOB_SLOWEST_RANK.name: slowest.rank,
        catalog.JOB_PEAK_MEMORY_MAX_BYTES.name: heaviest.peak_memory_bytes,
        catalog.JOB_PEAK_MEMORY_MAX_RANK.name: heaviest.rank,
        catalog.JOB_LOSS_MEAN.name: sum(r.loss for r in ranks) / len(ranks),
        catalog.JOB_LOSS_MAX.name: max(r.loss for r in ranks),
        catalog.JOB_WORLD_SIZE.name: ranks[0].world_size,
    })
    return values


def _node_value(metric: catalog.Metric, g: GpuSpec | None) -> float:
    attr = _GPU_FIELDS.get(metric.name)
    if attr is not None and g is not None:
        return float(getattr(g, attr))
    return _FIXED.get(metric.name, 1.0)


def exporter_exposition(node: str, gpus: Sequence[GpuSpec], namespace: str = "default") -> bytes:
    """One node exporter's /metrics: every GPU, process and host metric of the catalog."""
    fams = Families()
    node_known = {"node": node, "version": "0.1.0", "simulated": "true"}
    for metric in (*catalog.GPU, *catalog.HOST, *catalog.PROCESS):
        if "xid" in metric.labels:
            continue  # a healthy node has no XID series
        if "gpu" not in metric.labels and "pid" not in metric.labels:
            if metric is catalog.HOST_CPU_UTILIZATION_RATIO:  # the node total
                _add(fams, metric, {**node_known, "cpu": "all"}, 0.35)
            elif metric is catalog.HOST_CPU_CORE_UTILIZATION_RATIO:
                for cpu in range(HOST_CORES):
                    _add(fams, metric, {**node_known, "cpu": str(cpu)}, 0.3)
            else:
                _add(fams, metric, node_known, _node_value(metric, None))
            continue
        for g in gpus:
            if "pid" in metric.labels and not g.pid:
                continue
            _add_gpu(fams, metric, _gpu_known(node, g, namespace), g)
    for g in gpus:  # XID series exist only once an XID happened, as the real exporter's
        for code, count in g.xids:
            _add(fams, catalog.GPU_XID_ERRORS_TOTAL,
                 {**_gpu_known(node, g, namespace), "xid": str(code)}, float(count))
    return _render(fams.families())


def _add_gpu(fams: Families, metric: catalog.Metric, known: dict[str, str],
             g: GpuSpec) -> None:
    if metric is catalog.GPU_CLOCK_EVENT_ACTIVE:
        _add(fams, metric, known, 0.0, dict.fromkeys(g.clock_events, 1.0))
    elif metric is catalog.GPU_CLOCK_EVENT_REASONS:  # the same reasons, as NVML's bitmask
        _add(fams, metric, known, clock_event_mask(g.clock_events))
    elif metric is catalog.GPU_ECC_ERRORS_TOTAL:
        _add(fams, metric, known, 0.0, {"uncorrected": float(g.ecc_uncorrected)})
    else:
        _add(fams, metric, known, _node_value(metric, g))


def _gpu_known(node: str, g: GpuSpec, namespace: str) -> dict[str, str]:
    return {
        "gpu": str(g.gpu), "uuid": f"GPU-{node}-{g.gpu:04d}", "model": SIMULATED_GPU_MODEL,
        "node": node, "namespace": namespace if g.pod else "", "pod": g.pod,
        "container": "trainer" if g.pod else "", "pid": str(g.pid),
        "rank": "" if g.rank is None else str(g.rank),
        "local_rank": "" if g.rank is None else str(g.gpu),
        "command": f"python -m fsdpmon.trainer.train --local-rank {g.gpu}", "user": "root",
        "state": "running", "driver_version": "550.54.15", "cuda_version": "12.4",
        "pci_bus_id": f"00000000:{g.gpu + 16:02X}:00.0", "mig_mode": "disabled",
    }


def job_expositions(job: str, nodes: int, gpus_per_node: int) -> dict[str, bytes]:
    """Every payload of a healthy job: ``/train/<node>`` and ``/node/<node>`` paths → body."""
    world = nodes * gpus_per_node
    out: dict[str, bytes] = {}
    everyone = [RankSpec(rank=r, local_rank=r % gpus_per_node, world_size=world, nodes=nodes,
                         node=f"node-{r // gpus_per_node:03d}",
                         step_time_s=0.5 + 0.001 * (r % gpus_per_node)) for r in range(world)]
    for n in range(nodes):
        node = f"node-{n:03d}"
        ranks = everyone[n * gpus_per_node:(n + 1) * gpus_per_node]
        gpus = [GpuSpec(gpu=i, pod=f"{job}-worker-{n}", pid=1000 + i,
                        rank=n * gpus_per_node + i)
                for i in range(gpus_per_node)]
        out[f"/train/{node}"] = training_exposition(job, ranks, everyone)
        out[f"/node/{node}"] = exporter_exposition(node, gpus)
    return out
