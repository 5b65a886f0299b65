"""Read a finished (or running) job's figures from Prometheus with range queries (through
the one client of its API, fsdpmon.scrape.prometheus_api).

Each job becomes the same :class:`RunData` the JSONL loader produces: one Sample per rank per
evaluation time, built from the monitor's per-rank series. The job's lifetime is found first
with a coarse query, so ``--since 7d`` still yields a fine-grained window around a short run.
"""

from __future__ import annotations

import math
from typing import Any

from fsdpmon import catalog
from fsdpmon.conventions import JOB_LABEL, RANK_LABEL
from fsdpmon.errors import InputError
from fsdpmon.report.model import RunData, Sample
from fsdpmon.scrape.prometheus_api import PrometheusAPI

MAX_POINTS = 1000  # per series and query; Prometheus refuses more than 11,000

# Sample field -> the per-rank metric it comes from.
RANK_SERIES = {
    "step": catalog.TRAIN_STEP.name,
    "tokens_total": catalog.TRAIN_TOKENS_TOTAL.name,
    "tokens_per_second": catalog.TRAIN_TOKENS_PER_SECOND.name,
    "step_time_s": catalog.TRAIN_STEP_TIME_SECONDS.name,
    "mfu": catalog.TRAIN_MFU_RATIO.name,
    "data_wait": catalog.TRAIN_DATA_WAIT_RATIO.name,
    "peak_active": catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name,
    "rss": catalog.TRAIN_PROCESS_RSS_BYTES.name,
    "loss": catalog.TRAIN_LOSS.name,
}
INFO = catalog.TRAIN_INFO.name
FLOPS_PER_TOKEN = catalog.TRAIN_MODEL_FLOPS_PER_TOKEN.name
PEAK_FLOPS = catalog.TRAIN_DEVICE_PEAK_FLOPS.name

Series = dict[float, float]  # evaluation time -> value


def selector(job: str) -> str:
    escaped = job.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{{JOB_LABEL}="{escaped}"}}'


def _step_for(start: float, end: float) -> float:
    """Query resolution: MAX_POINTS evaluations over the span, but no finer than 100 ms."""
    return max(0.1, round((end - start) / MAX_POINTS, 1))


def _values(series: dict[str, Any]) -> Series:
    """A matrix series' [[time, "value"], ...] as floats; malformed points are skipped."""
    out: Series = {}
    for point in series.get("values") or []:
        try:
            stamp, value = float(point[0]), float(point[1])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(value):
            out[stamp] = value
    return out


def _labels(series: dict[str, Any]) -> dict[str, str]:
    labels = series.get("metric")
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def job_window(api: PrometheusAPI, job: str, since: float, until: float) -> tuple[float, float]:
    """The span in [since, until] during which the job had training series.

    Each coarse evaluation looks back over the whole step before it (max_over_time), so a job
    shorter than the coarse step is still found.
    """
    coarse = max(1, math.ceil((until - since) / MAX_POINTS))
    query = f"max(max_over_time({RANK_SERIES['step']}{selector(job)}[{coarse}s]))"
    result = api.query_range(query, since, until, coarse)
    stamps = sorted(t for series in result for t in _values(series))
    if not stamps:
        raise InputError(
            f"job {job!r}: no {RANK_SERIES['step']} series in {api.base_url} in the "
            "queried time range (check --job and --since)"
        )
    return max(since, stamps[0] - coarse), min(until, stamps[-1])


Window = tuple[float, float, float]  # start, end, step


def _per_rank(api: PrometheusAPI, metric: str, job: str, window: Window) -> dict[int, Series]:
    query = f"max by ({RANK_LABEL}) ({metric}{selector(job)})"
    by_rank: dict[int, Series] = {}
    for series in api.query_range(query, *window):
        rank = _labels(series).get(RANK_LABEL, "")
        if rank.isdigit():
            by_rank[int(rank)] = _values(series)
    return by_rank


def _last_scalar(api: PrometheusAPI, metric: str, job: str, window: Window) -> float | None:
    result = api.query_range(f"max({metric}{selector(job)})", *window)
    values = [v for series in result for _, v in sorted(_values(series).items())]
    return values[-1] if values else None


def _info_labels(api: PrometheusAPI, job: str, window: Window) -> dict[str, str]:
    query = f"max by (model, world_size, nodes, device) ({INFO}{selector(job)})"
    result = api.query_range(query, *window)
    latest = max(result, key=lambda s: max(_values(s), default=0.0), default=None)
    return _labels(latest) if latest else {}


def load_job(
    api: PrometheusAPI, job: str, since: float, until: float, step: float | None = None
) -> RunData:
    start, end = job_window(api, job, since, until)
    window = (start, end, step or _step_for(start, end))
    fields = {field: _per_rank(api, metric, job, window) for field, metric in RANK_SERIES.items()}
    ranks = _join(fields)
    if not ranks:
        raise InputError(f"job {job!r}: no rank has logged a step yet (no tokens/s series)")
    info = _info_labels(api, job, window)
    device = info.get("device") or "unknown"
    return RunData(
        name=job,
        source=f"{api.base_url} {JOB_LABEL}={job}",
        world_size=int(info["world_size"]) if info.get("world_size", "").isdigit() else len(ranks),
        nodes=int(info["nodes"]) if info.get("nodes", "").isdigit() else 1,
        model=info.get("model") or "unknown",
        device=device,
        flops_per_token=_last_scalar(api, FLOPS_PER_TOKEN, job, window),
        peak_flops=_last_scalar(api, PEAK_FLOPS, job, window),
        memory_source="device" if fields["peak_active"] else "rss",
        ranks=ranks,
    )


def _join(fields: dict[str, dict[int, Series]]) -> dict[int, tuple[Sample, ...]]:
    """Samples at the evaluation times where a rank had a step, its tokens/s and step time."""
    memory = fields["peak_active"] or fields["rss"]
    ranks: dict[int, tuple[Sample, ...]] = {}
    for rank, steps in sorted(fields["step"].items()):
        rate = fields["tokens_per_second"].get(rank, {})
        step_time = fields["step_time_s"].get(rank, {})
        tokens, mfu, loss, wait = (
            fields[name].get(rank, {}) for name in ("tokens_total", "mfu", "loss", "data_wait")
        )
        held_memory = memory.get(rank, {})
        samples = [
            Sample(
                time=t,
                step=int(steps[t]),
                tokens_total=tokens.get(t),
                tokens_per_second=rate[t],
                step_time_s=step_time[t],
                mfu=mfu.get(t),
                peak_memory_bytes=held_memory.get(t),
                loss=loss.get(t),
                data_wait_ratio=wait.get(t),
            )
            for t in sorted(steps)
            if t in rate and t in step_time
        ]
        if samples:
            ranks[rank] = _until_last_step(samples)
    return ranks


def _until_last_step(samples: list[Sample]) -> tuple[Sample, ...]:
    """Drop the evaluations after the final step: Prometheus repeats a series' last value for
    up to five minutes after it ends, which would otherwise dilute the throughput."""
    final = samples[-1].step
    first_final = next(i for i, s in enumerate(samples) if s.step == final)
    return tuple(samples[: first_final + 1])
