"""How often this process's CPU limit held it back: its cgroup's CFS throttling.

A pod's CPU limit is a CFS quota on its container's cgroup: each period (100 ms by default) the
cgroup may run ``quota`` of CPU time, and once spent every thread in it waits for the next
period, runnable but not run (it shows as run-queue delay: ``schedstat``). The kernel counts the
periods that ran and those that were throttled in the cgroup's ``cpu.stat``: ``nr_periods`` and
``nr_throttled`` (cgroup v2, and v1's cpu controller, which also has ``throttled_time``; v2 has
``throttled_usec``). cAdvisor serves the same counts as
``container_cpu_cfs_throttled_periods_total`` / ``container_cpu_cfs_periods_total``, and
kube-prometheus pages at 25% of periods throttled.

The monitor reads its own cgroup (inside a pod: the container's) once per log step: the path
from ``/proc/self/cgroup`` (re-read each time: a process can be moved, as a test does), the
mount points from ``/proc/self/mountinfo`` (once). v2 first, then v1's cpu controller. No file,
or one without the counts (no cpu controller there): unknown, not 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Mounts:
    v2: str | None = None  # where the unified hierarchy is mounted
    v1_cpu: tuple[str, str] | None = None  # (the cpu controller's mount point, its root)


def parse_mountinfo(text: str) -> Mounts:
    """The cgroup mounts of ``/proc/self/mountinfo``. Its lines (proc(5)): mount id, parent
    id, major:minor, root, mount point, mount options, zero or more optional fields, then the
    separator " - ", fs type, source, super options (spaces in names are escaped as \\040)."""
    v2, v1 = None, None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        root, point, fstype = fields[3], fields[4], tail[0]
        if fstype == "cgroup2" and v2 is None:
            v2 = point
        elif fstype == "cgroup" and "cpu" in tail[2].split(",") and v1 is None:
            v1 = (point, root)
    return Mounts(v2, v1)


def cgroup_paths(text: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 cpu controller's path) from ``/proc/self/cgroup``."""
    v2, v1 = None, None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _join(point: str, root: str, path: str) -> str:
    """A cgroup's directory: its path below the mount's root (a container sees its own cgroup
    mounted as the root of the hierarchy)."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.join(point, path.lstrip("/"))


def parse_cpu_stat(text: str) -> tuple[int, int] | None:
    """(nr_periods, nr_throttled), or None without those counts."""
    counts = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("nr_periods", "nr_throttled") and value.strip().isdigit():
            counts[key] = int(value)
    if len(counts) != 2:
        return None
    return counts["nr_periods"], counts["nr_throttled"]


class CgroupThrottling:
    """Throttled share of this process's cgroup's CFS periods since the last reading."""

    def __init__(self, proc: str = "/proc/self") -> None:
        self.proc = proc
        try:
            with open(f"{proc}/mountinfo", encoding="utf-8") as f:
                self.mounts = parse_mountinfo(f.read())
        except OSError:
            self.mounts = Mounts()
        self._last: tuple[str, int, int] | None = None  # (file, periods, throttled)

    def counts(self) -> tuple[str, int, int] | None:
        """(the cpu.stat read, nr_periods, nr_throttled) of our cgroup now."""
        try:
            with open(f"{self.proc}/cgroup", encoding="utf-8") as f:
                v2, v1 = cgroup_paths(f.read())
        except OSError:
            return None
        candidates = []
        if v2 is not None and self.mounts.v2:
            candidates.append(_join(self.mounts.v2, "/", v2))
        if v1 is not None and self.mounts.v1_cpu:
            candidates.append(_join(*self.mounts.v1_cpu, v1))
        for directory in candidates:
            try:
                with open(os.path.join(directory, "cpu.stat"), encoding="ascii") as f:
                    counts = parse_cpu_stat(f.read())
            except OSError:
                continue
            if counts is not None:
                return os.path.join(directory, "cpu.stat"), *counts
        return None

    def ratio(self) -> float | None:
        """nr_throttled / nr_periods since the last call (0.0 when no period ran: no limit,
        or nothing to run); None on the first call, when unknown, or after a move to another
        cgroup (its counts are not ours to subtract)."""
        now = self.counts()
        last, self._last = self._last, now
        if now is None or last is None or now[0] != last[0]:
            return None
        periods, throttled = now[1] - last[1], now[2] - last[2]
        if periods <= 0:
            return 0.0
        return min(1.0, max(0.0, throttled / periods))
