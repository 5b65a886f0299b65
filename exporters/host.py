"""Host CPU, load and memory from ``<proc_root>/stat``, ``loadavg`` and ``meminfo``.

Read from a configurable proc root (the host's /proc is mounted at /host/proc in the DaemonSet),
so these are the node's figures, not the exporter container's. Busy share per core comes from
the difference between two samples.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from fsdpmon.exporters.sample import HostSample

# /proc/stat cpu columns in order; guest time is already counted inside user/nice.
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
IDLE_MODES = ("idle", "iowait")


def parse_cpu_times(stat_text: str, ticks: float) -> dict[str, dict[str, float]]:
    """``{"all": {mode: seconds}, "0": {...}, ...}`` from /proc/stat."""
    out: dict[str, dict[str, float]] = {}
    for line in stat_text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *columns = line.split()
        cpu = "all" if name == "cpu" else name[3:]
        out[cpu] = {mode: int(v) / ticks for mode, v in zip(CPU_MODES, columns, strict=False)}
    return out


def parse_meminfo(text: str) -> dict[str, float]:
    """Bytes per /proc/meminfo key."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = float(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def busy_share(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    total = sum(after.values()) - sum(before.values())
    if total <= 0:
        return None
    idle = sum(after.get(m, 0.0) - before.get(m, 0.0) for m in IDLE_MODES)
    return min(1.0, max(0.0, (total - idle) / total))


class HostReader:
    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._previous: dict[str, dict[str, float]] = {}

    def _text(self, name: str) -> str:
        with open(os.path.join(self.proc_root, name), encoding="utf-8") as f:
            return f.read()

    def read(self) -> HostSample:
        cpus = parse_cpu_times(self._text("stat"), self._ticks)
        utilization = {}
        for cpu, times in cpus.items():
            share = busy_share(self._previous[cpu], times) if cpu in self._previous else None
            if share is not None:
                utilization[cpu] = share
        self._previous = cpus
        load = tuple(float(x) for x in self._text("loadavg").split()[:3])
        memory = parse_meminfo(self._text("meminfo"))
        total = memory.get("MemTotal", 0.0)
        available = memory.get("MemAvailable", memory.get("MemFree", 0.0))
        return HostSample(
            cpu_seconds=cpus.get("all", {}),
            cpu_utilization=utilization,
            load=(load[0], load[1], load[2]),
            memory_total_bytes=total,
            memory_available_bytes=available,
        )
