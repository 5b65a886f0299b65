"""The ranks dashboard: per-rank step time, phases, data wait, heartbeat and memory, to find the
slow rank of a job.
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.dashboards.panels import (
    Json,
    Panel,
    Row,
    Target,
    dashboard,
    heatmap,
    table,
    timeseries,
)
from fsdpmon.dashboards.promql import RANK_KEYS, bucket, m
from fsdpmon.dashboards.scope import JOB, PER_RANK, RANK, RATE, links, variables


def _peak_memory(sel: str) -> str:
    """Peak device memory per rank, process RSS where a rank has no device (CPU runs)."""
    return (f"{m(catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES, sel)}"
            f" or {m(catalog.TRAIN_PROCESS_RSS_BYTES, sel)}")


def _rank_step_times() -> list[Panel | Row]:
    step = m(catalog.TRAIN_STEP_TIME_SECONDS, RANK)
    hist = bucket(catalog.TRAIN_STEP_DURATION_SECONDS, RANK)

    def quantile(q: float) -> Target:
        return Target(f"histogram_quantile({q:g}, sum by ({RANK_KEYS}, le) "
                      f"(rate({hist}[{RATE}])))", f"p{q * 100:g} {PER_RANK}")

    return [
        Row("Step time per rank"),
        heatmap("Step time per rank", Target(step, PER_RANK), unit="s"),
        timeseries("Step time per rank", Target(step, PER_RANK), unit="s", width=12),
        timeseries("Step time spread (rank 0's view of the job)",
                   *(Target(m(metric, JOB), f"{k} {{{{job_name}}}}") for k, metric in (
                       ("min", catalog.JOB_STEP_TIME_MIN_SECONDS),
                       ("median", catalog.JOB_STEP_TIME_MEDIAN_SECONDS),
                       ("max", catalog.JOB_STEP_TIME_MAX_SECONDS))), unit="s", width=12),
        timeseries("Step duration p50 / p99 per rank", quantile(0.5), quantile(0.99), unit="s",
                   width=12),
    ]


def _rank_stragglers() -> list[Panel | Row]:
    return [
        Row("Stragglers"),
        timeseries("Slowest rank and highest-memory rank",
                   Target(m(catalog.JOB_SLOWEST_RANK, JOB), "slowest {{job_name}}"),
                   Target(m(catalog.JOB_PEAK_MEMORY_MAX_RANK, JOB), "most memory {{job_name}}"),
                   description="Slowest: the rank with the most busy time (step time minus "
                               "collective wait), as rank 0 computes it.", width=6),
        timeseries("Data-wait share per rank",
                   Target(m(catalog.TRAIN_DATA_WAIT_RATIO, RANK), PER_RANK),
                   unit="percentunit", width=9),
        timeseries("Time per step by phase",
                   Target(f"avg by (phase) ({m(catalog.TRAIN_PHASE_DURATION_SECONDS, RANK)})",
                          "{{phase}}"), unit="s", stack=True, width=9),
        timeseries("Heartbeat age per rank",
                   Target(m(catalog.TRAIN_HEARTBEAT_AGE_SECONDS, RANK), PER_RANK),
                   Target(m(catalog.TRAIN_STALL_THRESHOLD_SECONDS, RANK),
                          "stall threshold " + PER_RANK), unit="s", width=12),
        timeseries("Tokens/s per rank",
                   Target(m(catalog.TRAIN_TOKENS_PER_SECOND, RANK), PER_RANK), width=12),
    ]


def _rank_memory() -> list[Panel | Row]:
    return [
        Row("Memory"),
        timeseries("Peak memory per rank", Target(_peak_memory(RANK), PER_RANK), unit="bytes",
                   description="Peak active device memory in the log window (process RSS for "
                               "ranks without a GPU).", width=8),
        timeseries("Highest peak memory over ranks",
                   Target(m(catalog.JOB_PEAK_MEMORY_MAX_BYTES, JOB), "{{job_name}}"),
                   unit="bytes", width=8),
        timeseries("Allocator retries and OOMs",
                   Target(f"increase({m(catalog.TRAIN_ALLOC_RETRIES_TOTAL, RANK)}[{RATE}])",
                          "retries " + PER_RANK),
                   Target(f"increase({m(catalog.TRAIN_OOMS_TOTAL, RANK)}[{RATE}])",
                          "OOMs " + PER_RANK), width=8),
        table("Ranks now",
              *(Target(m(metric, RANK)) for metric in (
                  catalog.TRAIN_STEP_TIME_SECONDS, catalog.TRAIN_DATA_WAIT_RATIO,
                  catalog.TRAIN_TOKENS_PER_SECOND, catalog.TRAIN_HEARTBEAT_AGE_SECONDS,
                  catalog.TRAIN_STEP)), height=10),
    ]


def ranks() -> Json:
    items = [*_rank_step_times(), *_rank_stragglers(), *_rank_memory()]
    return dashboard("fsdpmon-ranks", "fsdpmon / Ranks and stragglers",
                     "Per-rank step time, phases, data wait and memory: find the slow rank.",
                     items, variables("namespace", "job", "rank"),
                     links("namespace", "job"))
