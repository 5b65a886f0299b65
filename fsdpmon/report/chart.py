"""The scaling chart: throughput and memory per GPU against the number of GPUs (PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

from fsdpmon.report.model import RunStats

MEASURED = {"marker": "o", "linewidth": 2, "color": "tab:blue", "label": "measured"}
IDEAL = {"linestyle": "--", "linewidth": 1.5, "color": "tab:gray", "label": "ideal (linear)"}


def _wide(gpus: list[int]) -> bool:
    """Whether the GPU counts span enough octaves to need a log axis."""
    return max(gpus) / min(gpus) >= 8


def _gpu_axis(ax: Axes, gpus: list[int]) -> None:
    ax.set_xlabel("GPUs (ranks)")
    if _wide(gpus):
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(gpus)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.grid(True, alpha=0.3)


THOUSANDS = FuncFormatter(lambda y, _: f"{y:,.0f}")


def _total_panel(ax: Axes, runs: Sequence[RunStats], gpus: list[int]) -> None:
    base = runs[0]
    ideal = [base.tokens_per_second * g / base.world_size for g in gpus]
    ax.plot(gpus, ideal, **IDEAL)
    ax.plot(gpus, [r.tokens_per_second for r in runs], **MEASURED)
    for run in runs:
        if run.scaling_efficiency is not None:
            ax.annotate(
                f"{run.scaling_efficiency * 100:.0f}%",
                (run.world_size, run.tokens_per_second),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=9,
            )
    ax.set_title("Total throughput (labels: scaling efficiency)")
    ax.set_ylabel("tokens/s (whole job)")
    if _wide(gpus):
        ax.set_yscale("log")  # log-log keeps the ideal line straight
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(NullLocator())
    else:
        ax.set_ylim(bottom=0, top=max(ideal + [r.tokens_per_second for r in runs]) * 1.15)
    ax.yaxis.set_major_formatter(THOUSANDS)


def _per_gpu_panel(ax: Axes, runs: Sequence[RunStats], gpus: list[int]) -> None:
    base = runs[0].tokens_per_second_per_gpu
    ax.plot(gpus, [base] * len(gpus), **{**IDEAL, "label": "ideal (no loss per GPU)"})
    ax.plot(gpus, [r.tokens_per_second_per_gpu for r in runs], **MEASURED)
    ax.set_title("Throughput per GPU")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_ylim(bottom=0, top=max(base, *(r.tokens_per_second_per_gpu for r in runs)) * 1.15)
    ax.yaxis.set_major_formatter(THOUSANDS)


def _memory_panel(ax: Axes, runs: Sequence[RunStats], gpus: list[int]) -> None:
    known = [(r.world_size, r.peak_memory_bytes_per_gpu) for r in runs]
    known = [(g, m / 1024**3) for g, m in known if m is not None]
    rss = any(r.memory_source == "rss" for r in runs)
    if known:
        ax.plot(*zip(*known, strict=True), **{**MEASURED, "color": "tab:orange"})
        ax.set_ylim(bottom=0, top=max(m for _, m in known) * 1.15)
    else:
        ax.text(0.5, 0.5, "no memory figures logged", ha="center", transform=ax.transAxes)
    ax.set_title("Peak memory per GPU" + (" (process RSS on CPU)" if rss else ""))
    ax.set_ylabel("GiB per GPU")


def write_chart(runs: Sequence[RunStats], path: Path) -> Path:
    """Draw the three panels; ``runs`` sorted by world size, smallest (the baseline) first."""
    gpus = [r.world_size for r in runs]
    # A bare Figure renders with the Agg canvas and touches no pyplot global state, so it works
    # without a display and never leaks figures in a long-lived process.
    figure = Figure(figsize=(16, 5), layout="constrained")
    axes = figure.subplots(1, 3)
    _total_panel(axes[0], runs, gpus)
    _per_gpu_panel(axes[1], runs, gpus)
    _memory_panel(axes[2], runs, gpus)
    for ax in axes:
        _gpu_axis(ax, gpus)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    models = ", ".join(sorted({r.model for r in runs}))
    devices = ", ".join(sorted({r.device for r in runs}))
    figure.suptitle(f"FSDP scaling: {models} on {devices}", fontsize=14)
    figure.savefig(path, dpi=110)
    return path
