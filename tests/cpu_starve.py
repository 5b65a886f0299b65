"""Starving one rank of CPU from outside the job, as a noisy neighbour or a pod's CPU limit does.

- ``neighbours(pid, core, n)``: pins every thread of ``pid`` to ``core`` with ``taskset`` and
  starts ``n`` busy loops pinned there too: the rank gets a share of one core.
- ``loose_loops(n)``: ``n`` busy loops the scheduler may put anywhere (a noisy neighbour every
  rank shares); ``pinned_alike(pids, core)``: every rank on one core, each as starved as the
  others. Healthy twins: nobody is to blame.
- ``cpu_quota(pid, percent)``: moves ``pid`` into a new cgroup with a CFS quota of ``percent``
  of one CPU per 100 ms period: cgroup v2's ``cpu.max`` where the unified hierarchy has the cpu
  controller (enabled for children of its root), else cgroup v1's ``cpu.cfs_quota_us`` (a hybrid
  host, as this one). Needs root; ``QuotaUnavailable`` says why not. On exit the process goes
  back to the cgroup it came from and the new one is removed.

Shared by tests/test_e2e_blind.py and benchmarks/bench_blind.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from proc_tree import kill_tree

from fsdpmon.monitor.cpustat import cgroup_paths, parse_mountinfo

PERIOD_US = 100_000
BUSY_LOOP = "while True:\n    pass\n"


class QuotaUnavailable(Exception):
    """Why no CPU quota can be set here (a reason to skip, in words)."""


@contextlib.contextmanager
def neighbours(pid: int, core: int, count: int = 2) -> Iterator[list[subprocess.Popen]]:
    subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)], check=True,
                   capture_output=True)
    loops = [subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", BUSY_LOOP],
                              start_new_session=True) for _ in range(count)]
    try:
        yield loops
    finally:
        for loop in loops:
            kill_tree(loop)
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            subprocess.run(["taskset", "-a", "-p", "-c", f"0-{os.cpu_count() - 1}", str(pid)],
                           check=True, capture_output=True)


@contextlib.contextmanager
def loose_loops(count: int = 2) -> Iterator[list[subprocess.Popen]]:
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
             for _ in range(count)]
    try:
        yield loops
    finally:
        for loop in loops:
            kill_tree(loop)


@contextlib.contextmanager
def pinned_alike(pids: list[int], core: int) -> Iterator[None]:
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(pid)], check=True,
                       capture_output=True)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
                subprocess.run(["taskset", "-a", "-p", "-c", f"0-{os.cpu_count() - 1}",
                                str(pid)], check=True, capture_output=True)


def _hierarchy() -> tuple[str, Path, Path]:
    """("v2" or "v1", the directory new cgroups go in, the cgroup the caller is in)."""
    if os.geteuid() != 0:
        raise QuotaUnavailable("setting a CPU quota needs root (cgroup writes)")
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    v2_path, v1_path = cgroup_paths(Path("/proc/self/cgroup").read_text())
    if mounts.v2 and v2_path is not None:
        root = Path(mounts.v2)
        if "cpu" in (root / "cgroup.controllers").read_text().split():
            return "v2", root, root / v2_path.lstrip("/")
    if mounts.v1_cpu and v1_path is not None:
        point, mount_root = mounts.v1_cpu
        if mount_root == "/":
            return "v1", Path(point), Path(point) / v1_path.lstrip("/")
    raise QuotaUnavailable("no cgroup hierarchy with the cpu controller to create a cgroup in "
                           "(cgroup v2 without cpu delegated, and no cgroup v1 cpu mount)")


@contextlib.contextmanager
def cpu_quota(pid: int, percent: float, name: str = "") -> Iterator[Path]:
    version, base, home = _hierarchy()
    group = base / (name or f"fsdpmon-quota-{os.getpid()}-{pid}")
    quota = int(PERIOD_US * percent / 100)
    try:
        if version == "v2":
            with contextlib.suppress(OSError):  # already on, or refused: the mkdir shows
                (base / "cgroup.subtree_control").write_text("+cpu")
        group.mkdir()
        if version == "v2":
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        raise QuotaUnavailable(f"cannot create a {version} cgroup with a CPU quota under "
                               f"{base}: {exc}") from None
    v2_path, v1_path = cgroup_paths(Path(f"/proc/{pid}/cgroup").read_text())
    theirs = v2_path if version == "v2" else v1_path
    back = base / theirs.lstrip("/") if theirs is not None else home  # where it goes back to
    try:
        (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        with contextlib.suppress(OSError):  # the process may be gone
            (back / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            group.rmdir()
