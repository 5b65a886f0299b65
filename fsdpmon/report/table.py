"""The Markdown report: one table row per run, and the notes a reader needs to trust it."""

from __future__ import annotations

from collections.abc import Sequence

from fsdpmon.report.model import RunStats

COLUMNS = (
    "Run",
    "GPUs",
    "Nodes",
    "Tokens/s",
    "Tokens/s per GPU",
    "Step time median (s)",
    "Step time p90 (s)",
    "MFU",
    "Data wait",
    "Peak memory per GPU (GiB)",
    "Scaling efficiency",
    "Goodput",
)

GIB = 1024**3


def format_tokens(value: float) -> str:
    return f"{value:,.1f}"


def format_seconds(value: float) -> str:
    return f"{value:.4f}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.3f}"


def row(stats: RunStats) -> list[str]:
    return [
        f"`{stats.name}`",
        str(stats.world_size),
        str(stats.nodes),
        format_tokens(stats.tokens_per_second),
        format_tokens(stats.tokens_per_second_per_gpu),
        format_seconds(stats.step_time_median_s),
        format_seconds(stats.step_time_p90_s),
        _percent(stats.mfu),
        _percent(stats.data_wait_ratio),
        _gib(stats.peak_memory_bytes_per_gpu),
        _percent(stats.scaling_efficiency),
        _percent(stats.goodput_ratio),
    ]


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def markdown_table(runs: Sequence[RunStats]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(row(s)) + " |" for s in runs]
    return "\n".join(lines)


def _notes(runs: Sequence[RunStats], warmup: str, chart_name: str | None) -> list[str]:
    notes = [
        f"- Measured window: {warmup}. Tokens/s is tokens processed over wall-clock time in "
        "that window; step times are the per-rank log-window means, pooled over ranks; "
        "data wait is the share of step time spent waiting for input.",
        "- Scaling efficiency: tokens/s per GPU divided by that of the smallest run "
        f"(`{runs[0].name}`, {_gpus(runs[0].world_size)}); 100% is linear scaling.",
    ]
    if any(s.memory_source == "rss" for s in runs):
        notes.append("- On CPU runs, 'peak memory per GPU' is each rank's process RSS.")
    if any(s.mfu is None for s in runs):
        notes.append("- MFU is n/a where the device's peak FLOP/s is unknown (e.g. CPU).")
    partial = [s for s in runs if s.ranks_seen < s.world_size]
    for s in partial:
        notes.append(
            f"- `{s.name}`: logs of {s.ranks_seen} of {s.world_size} ranks were found; its "
            "total tokens/s is the per-GPU mean times the world size."
        )
    models = sorted({s.model for s in runs})
    if len(models) > 1:
        notes.append(f"- Warning: the runs trained different models ({', '.join(models)}).")
    if chart_name:
        notes.append(f"\n![Scaling chart]({chart_name})")
    return notes


def markdown_report(
    runs: Sequence[RunStats], *, warmup: str, chart_name: str | None = "scaling.png"
) -> str:
    """The whole ``report.md``; ``runs`` must be sorted by world size (smallest first)."""
    if not runs:
        raise ValueError("a report needs at least one run")
    models = ", ".join(sorted({s.model for s in runs}))
    devices = ", ".join(sorted({s.device for s in runs}))
    parts = [
        "# FSDP scaling report",
        "",
        f"Model: {models}. Device: {devices}. Runs: {len(runs)}.",
        "",
        markdown_table(runs),
        "",
        *_notes(runs, warmup, chart_name),
        "",
        "Sources:",
        "",
        *(f"- `{s.name}`: `{s.source}`" for s in runs),
        "",
    ]
    return "\n".join(parts)
