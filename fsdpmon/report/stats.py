"""Pure figures for a scaling study: throughput, step-time percentiles, MFU, memory, efficiency.

Warm-up is left out: the first logged window holds process start, compilation and the first
collectives, so by default a rank's figures start after its first sample (``warmup_steps``
overrides this). Throughput is what a rank actually processed over wall time, i.e.
(tokens_total at the end - at the end of warm-up) / elapsed seconds; the job's total is the
per-GPU mean times the world size, which is the plain sum when every rank's log is present and
still a fair estimate when only some nodes' logs were collected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from statistics import fmean

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.report.model import RunData, RunStats, Sample


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    a, b, f = ordered[low], ordered[high], position - low
    value = a + (b - a) * f
    # b - a overflows for finite values of opposite sign near float's limit: weigh them instead
    return value if math.isfinite(value) else a * (1 - f) + b * f


def _mean(values: Iterable[float]) -> float:
    """fmean (exactly rounded); its exact sum raises OverflowError past float's limit, where the
    values are scaled down first (each v/n, so the sum stays in range)."""
    items = list(values)
    try:
        return fmean(items)
    except OverflowError:
        return sum(v / len(items) for v in items)


def split_warmup(
    samples: Sequence[Sample], warmup_steps: int | None
) -> tuple[Sample | None, list[Sample]]:
    """(the last warm-up sample, the measured samples after it).

    With ``warmup_steps`` None the first sample is the warm-up; a single sample is all there is
    to measure, so it is kept.
    """
    if len(samples) == 1:
        return None, list(samples)
    limit = samples[0].step if warmup_steps is None else warmup_steps
    warm = [s for s in samples if s.step <= limit]
    measured = [s for s in samples if s.step > limit]
    return (warm[-1] if warm else None), measured


def rank_throughput(baseline: Sample | None, measured: Sequence[Sample]) -> float:
    """Tokens per second one rank processed over the measured window."""
    last = measured[-1]
    if (
        baseline is not None
        and baseline.tokens_total is not None
        and last.tokens_total is not None
        and last.time > baseline.time
        and last.tokens_total >= baseline.tokens_total  # a counter reset: fall back below
    ):
        return (last.tokens_total - baseline.tokens_total) / (last.time - baseline.time)
    return _mean(s.tokens_per_second for s in measured)


def run_stats(run: RunData, warmup_steps: int | None = None) -> RunStats:
    throughputs: list[float] = []
    step_times: list[float] = []
    mfus: list[float] = []
    waits: list[float] = []
    memory: list[float] = []
    measured_steps = 0
    for rank, samples in run.ranks.items():
        baseline, measured = split_warmup(samples, warmup_steps)
        if not measured:
            raise ConfigError(
                "--warmup-steps",
                f"{warmup_steps} leaves nothing to measure in {run.name} rank {rank} "
                f"(last logged step {samples[-1].step})",
            )
        throughputs.append(rank_throughput(baseline, measured))
        step_times.extend(s.step_time_s for s in measured)
        mfus.extend(s.mfu for s in measured if s.mfu is not None)
        waits.extend(s.data_wait_ratio for s in measured if s.data_wait_ratio is not None)
        memory.extend(s.peak_memory_bytes for s in samples if s.peak_memory_bytes is not None)
        start = baseline.step if baseline else 0
        measured_steps = max(measured_steps, measured[-1].step - start)
    per_gpu = _mean(throughputs)
    last_samples = [samples[-1] for samples in run.ranks.values()]
    losses = [s.loss for s in last_samples if s.loss is not None]
    return _in_range(RunStats(
        name=run.name,
        source=run.source,
        world_size=run.world_size,
        nodes=run.nodes,
        model=run.model,
        device=run.device,
        ranks_seen=len(run.ranks),
        last_step=max(s.step for s in last_samples),
        measured_steps=measured_steps,
        tokens_per_second=per_gpu * run.world_size,
        tokens_per_second_per_gpu=per_gpu,
        step_time_median_s=percentile(step_times, 50),
        step_time_p90_s=percentile(step_times, 90),
        mfu=_mfu(run, per_gpu, mfus),
        data_wait_ratio=_mean(waits) if waits else None,
        peak_memory_bytes_per_gpu=max(memory) if memory else None,
        memory_source=run.memory_source,
        final_loss=_mean(losses) if losses else None,
        goodput_ratio=run.goodput_ratio, badput_seconds=run.badput_seconds,
    ))


def _in_range(stats: RunStats) -> RunStats:
    """Every figure finite: logged figures near float's limit (finite, so the loader took them)
    can still overflow a product or difference; that is a log no real run writes, named in one
    line rather than reported as inf."""
    for field in dataclasses.fields(stats):
        value = getattr(stats, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"run {stats.name}: {field.name} comes out as {value} from the "
                             "logged figures: they are out of any real range")
    return stats


def _mfu(run: RunData, per_gpu: float, logged: list[float]) -> float | None:
    """MFU over the same window as the throughput; None when the device's peak is unknown."""
    if run.flops_per_token and run.peak_flops:
        return per_gpu * run.flops_per_token / run.peak_flops
    return _mean(logged) if logged else None


def with_scaling(stats: Sequence[RunStats]) -> list[RunStats]:
    """Runs sorted by world size, each with its scaling efficiency against the smallest.

    Efficiency = per-GPU throughput / the smallest run's per-GPU throughput: 1.0 is perfectly
    linear scaling. Among several smallest runs the first given is the baseline.
    """
    if not stats:
        return []
    baseline = min(stats, key=lambda s: s.world_size)
    base = baseline.tokens_per_second_per_gpu
    ordered = sorted(stats, key=lambda s: s.world_size)
    return [
        replace(s, scaling_efficiency=_ratio(s.tokens_per_second_per_gpu, base)) for s in ordered
    ]


def _ratio(value: float, base: float) -> float | None:
    """value / base; None where it has no finite answer (no baseline throughput, or overflow)."""
    if base <= 0:
        return None
    ratio = value / base
    return ratio if math.isfinite(ratio) else None
