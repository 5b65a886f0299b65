"""The columns of the table views: title, how to read a row, how to show it, how to sort it.

Sorting uses the raw value (None sorts last); showing uses the formatter. The key (first field)
is what `--sort` and the `<`/`>` keys cycle through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fsdpmon.job.snapshot import GpuRow, ProcessRow, RankRow
from fsdpmon.top import fmt


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    value: Callable[[Any], Any]
    show: Callable[[Any], str] = str
    justify: str = "right"
    min_width: int | None = None
    max_width: int | None = None
    ratio: int | None = None  # columns with a ratio share the spare width (pod, command)
    cell: Callable[[Any], str] | None = None  # the text from the whole row, when show can't

    def text(self, row: Any) -> str:
        return self.cell(row) if self.cell is not None else self.show(self.value(row))


def short_target(url: str) -> str:
    """``http://10.0.0.7:9520/metrics`` → ``10.0.0.7:9520`` (what a person calls the target)."""
    return url.split("://", 1)[-1].split("/", 1)[0]


def _opt_str(value: Any) -> str:
    return fmt.MISSING if value is None else str(value)


RANK_COLUMNS: tuple[Column, ...] = (
    Column("rank", "RANK", lambda r: r.rank),
    Column("pod", "POD", lambda r: r.pod or short_target(r.target), justify="left",
           min_width=10, max_width=40),
    Column("node", "NODE", lambda r: r.node, justify="left", min_width=6, max_width=16),
    Column("step", "STEP", lambda r: r.step, _opt_str),
    Column("step_time", "STEP T", lambda r: r.step_time_s, fmt.seconds),
    Column("data_wait", "WAIT", lambda r: r.data_wait_ratio, fmt.pct),
    Column("memory", "MEM", lambda r: r.peak_memory_bytes, fmt.size),
    Column("loss", "LOSS", lambda r: r.loss, fmt.fixed),
    Column("heartbeat", "BEAT", lambda r: r.heartbeat_age_s, fmt.age),
    # The last column takes the spare width, as htop's command does: on a wide terminal the
    # figures stay next to the pod they belong to.
    Column("flags", "FLAGS", lambda r: r.flags, justify="left", min_width=7, ratio=1),
)

GPU_COLUMNS: tuple[Column, ...] = (
    Column("node", "NODE", lambda g: g.node, justify="left", min_width=6, max_width=16),
    Column("gpu", "GPU", lambda g: int(g.gpu) if g.gpu.isdigit() else g.gpu),
    Column("util", "UTIL", lambda g: g.utilization_ratio, fmt.pct),
    Column("memory", "MEM", lambda g: g.memory_ratio, fmt.pct),
    Column("memory_used", "USED", lambda g: g.memory_used_bytes, fmt.size),
    Column("temp", "TEMP", lambda g: g.temperature_celsius, lambda v: fmt.unit(v, "C")),
    Column("power", "POWER", lambda g: g.power_watts, lambda v: fmt.unit(v, "W")),
    Column("pod", "POD", lambda g: g.pod, justify="left", min_width=4, ratio=1),
)

PROCESS_COLUMNS: tuple[Column, ...] = (
    Column("pid", "PID", lambda p: p.pid),
    Column("node", "NODE", lambda p: p.node, justify="left", min_width=6, max_width=14),
    Column("pod", "POD", lambda p: p.pod, justify="left", min_width=4, max_width=24),
    Column("container", "CONT", lambda p: p.container, justify="left", min_width=4,
           max_width=10),
    Column("cpu", "CPU%", lambda p: p.cpu_ratio, lambda v: fmt.pct(v)),
    Column("rss", "RSS", lambda p: p.rss_bytes, fmt.size),
    Column("gpu_memory", "GPU MEM", lambda p: p.gpu_memory_bytes, fmt.size,
           cell=lambda p: fmt.size(p.gpu_memory_bytes) + (" SIM" if p.gpu_simulated else "")),
    Column("state", "S", lambda p: p.state[:1].upper()),
    Column("command", "COMMAND", lambda p: p.command, fmt.command, justify="left",
           min_width=8, ratio=2),
)

COLUMNS: dict[str, tuple[Column, ...]] = {
    "ranks": RANK_COLUMNS,
    "gpus": GPU_COLUMNS,
    "processes": PROCESS_COLUMNS,
}

# What each table shows first: the slowest ranks, the least busy GPUs, the busiest processes.
DEFAULT_SORT: dict[str, tuple[str, bool]] = {
    "ranks": ("rank", False),
    "gpus": ("node", False),
    "processes": ("cpu", True),
}

Row = RankRow | GpuRow | ProcessRow


def column(view: str, key: str) -> Column:
    for col in COLUMNS[view]:
        if col.key == key:
            return col
    raise KeyError(key)
