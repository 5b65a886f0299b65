"""A process's own cgroup CPU throttling, read as the kernel lays it out (v2, v1, a container's
view), from files shaped as /proc and /sys/fs/cgroup show them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdpmon.monitor.cpustat import (
    CgroupThrottling,
    _join,
    cgroup_paths,
    parse_cpu_stat,
    parse_mountinfo,
)

HYBRID = """\
25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
27 25 0:25 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw
29 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
30 25 0:28 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
"""
V2_STAT = """usage_usec 8000
user_usec 6000
system_usec 2000
nr_periods 131
nr_throttled 130
throttled_usec 8505560
nr_bursts 0
burst_usec 0
"""
V1_STAT = "nr_periods 40\nnr_throttled 10\nthrottled_time 1200000\n"


def test_mounts_of_a_hybrid_host():
    mounts = parse_mountinfo(HYBRID)
    assert mounts.v2 == "/sys/fs/cgroup/unified"
    assert mounts.v1_cpu == ("/sys/fs/cgroup/cpu,cpuacct", "/")  # not cpuset's
    container = "61 60 0:30 /kubepods/pod1/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert parse_mountinfo(container).v2 == "/sys/fs/cgroup"


def test_paths_from_proc_self_cgroup():
    assert cgroup_paths("0::/kubepods.slice/x.scope\n") == ("/kubepods.slice/x.scope", None)
    text = "4:cpuset:/\n3:cpu,cpuacct:/job/rank1\n0::/user.slice\n"
    assert cgroup_paths(text) == ("/user.slice", "/job/rank1")


def test_cpu_stat_counts_v2_and_v1_and_none_without_them():
    assert parse_cpu_stat(V2_STAT) == (131, 130)
    assert parse_cpu_stat(V1_STAT) == (40, 10)
    assert parse_cpu_stat("usage_usec 5\nuser_usec 3\nsystem_usec 2\n") is None  # no cpu ctl


class FakeHost:
    """/proc/self and a cgroup tree under ``root``, as a container or a host lays them out."""

    def __init__(self, root: Path, mountinfo: str) -> None:
        self.root, self.proc = root, root / "proc"
        self.proc.mkdir(parents=True)
        (self.proc / "mountinfo").write_text(mountinfo)

    def place(self, cgroup_line: str) -> None:
        (self.proc / "cgroup").write_text(cgroup_line)

    def stat(self, directory: str, periods: int, throttled: int) -> None:
        path = self.root / directory.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.stat").write_text(
            f"usage_usec 1\nnr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec 9\n")


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path, f"27 25 0:25 / {tmp_path}/cg rw - cgroup2 cgroup2 rw\n")


def test_throttled_share_of_the_periods_between_readings(host):
    host.place("0::/pod/ctr\n")
    host.stat("cg/pod/ctr", 100, 10)
    reader = CgroupThrottling(str(host.proc))
    assert reader.ratio() is None  # nothing to compare with yet
    host.stat("cg/pod/ctr", 140, 40)
    assert reader.ratio() == pytest.approx(30 / 40)
    assert reader.ratio() == 0.0  # no period ran since: no limit hit


def test_a_move_to_another_cgroup_starts_over(host):
    host.place("0::/a\n")
    host.stat("cg/a", 10, 0)
    host.stat("cg/b", 500, 400)
    reader = CgroupThrottling(str(host.proc))
    reader.ratio()
    host.place("0::/b\n")
    assert reader.ratio() is None  # b's counts are not a's to subtract from
    host.stat("cg/b", 510, 409)
    assert reader.ratio() == pytest.approx(0.9)


def test_v1_cpu_controller_under_a_container_root(tmp_path):
    """A v1 hierarchy mounted at the container's own cgroup (its root is that path)."""
    mount = f"29 25 0:27 /kubepods/p1 {tmp_path}/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
    host = FakeHost(tmp_path, mount)
    host.place("3:cpu,cpuacct:/kubepods/p1\n0::/\n")
    host.stat("cpu", 10, 5)
    reader = CgroupThrottling(str(host.proc))
    reader.ratio()
    host.stat("cpu", 20, 10)
    assert reader.ratio() == pytest.approx(0.5)


def test_no_cgroup_files_is_unknown_not_zero(tmp_path):
    host = FakeHost(tmp_path, "")
    host.place("0::/\n")
    reader = CgroupThrottling(str(host.proc))
    assert reader.ratio() is None and reader.ratio() is None
    assert CgroupThrottling(str(tmp_path / "nowhere")).ratio() is None


# This machine's /proc/self/mountinfo (a v1 host: cpu and cpuacct apart, no optional fields)
# and the kernel's own example line (proc(5): "master:1" is an optional field).
V1_HOST = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
"""
KERNEL_EXAMPLE = "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"


def test_mounts_of_a_v1_host_without_optional_fields():
    mounts = parse_mountinfo(KERNEL_EXAMPLE + V1_HOST)
    assert (mounts.v2, mounts.v1_cpu) == (None, ("/sys/fs/cgroup/cpu", "/")), mounts


def test_the_first_cgroup2_mount_is_kept_and_its_type_is_the_one_after_the_separator():
    """A cgroup2 mounted with source "none" (mount -t cgroup2 none DIR), then a second one;
    and a tmpfs whose source is named cgroup2 is no cgroup2."""
    text = ("50 31 0:40 / /sys/fs/cgroup/fake rw shared:1 - tmpfs cgroup2 rw\n"
            "51 31 0:41 / /sys/fs/cgroup/unified rw,relatime shared:2 - cgroup2 none rw\n"
            "52 31 0:41 / /mnt/again rw,relatime - cgroup2 cgroup2 rw\n")
    assert parse_mountinfo(text).v2 == "/sys/fs/cgroup/unified", parse_mountinfo(text)


@pytest.mark.parametrize("line", [
    "27 25 0:25 / /sys/fs/cgroup/unified - cgroup2 cgroup2 rw",  # 5 fields: no mount options
    "27 25 0:25 / /sys/fs/cgroup/unified rw cgroup2 cgroup2 rw",  # no separator
    "27 25 0:25 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2",  # no super options
])
def test_a_line_short_of_the_kernels_fields_is_skipped_not_misread(line):
    good = "41 31 0:38 / /sys/fs/cgroup/v2 rw,relatime - cgroup2 cgroup2 rw\n"
    assert parse_mountinfo(line + "\n" + good).v2 == "/sys/fs/cgroup/v2", line


def test_a_cgroup_path_may_hold_colons():
    """Only the first two colons separate (hierarchy id, controllers, path)."""
    assert cgroup_paths("0::/kubepods/pod-a:b/ctr\n") == ("/kubepods/pod-a:b/ctr", None)
    assert cgroup_paths("1:cpu:/job:1\n") == (None, "/job:1")


def test_a_path_below_the_mounts_root_is_taken_from_that_root():
    assert _join("/cg/cpu", "/kubepods/p1", "/kubepods/p1/ctr") == "/cg/cpu/ctr"
    assert _join("/cg/cpu", "/kubepods/p1", "/kubepods/p1") == "/cg/cpu/"
    # Outside the root (a sibling that shares its prefix, or elsewhere): left whole.
    assert _join("/cg/cpu", "/kubepods/p1", "/kubepods/p10") == "/cg/cpu/kubepods/p10"
    assert _join("/cg/cpu", "/kubepods/p1", "/system.slice/x") == "/cg/cpu/system.slice/x"
    assert _join("/cg", "/", "/pod/ctr") == "/cg/pod/ctr"


def test_a_v1_cpu_line_without_its_mount_reads_the_v2_cgroup(host):
    """/proc/self/cgroup lists every hierarchy, mounted here or not: a container that mounts
    only cgroup2 still sees the host's v1 cpu line."""
    host.place("3:cpu,cpuacct:/kubepods/p1\n0::/pod/ctr\n")
    host.stat("cg/pod/ctr", 10, 0)
    reader = CgroupThrottling(str(host.proc))
    assert reader.ratio() is None
    host.stat("cg/pod/ctr", 20, 5)
    assert reader.ratio() == pytest.approx(0.5)


def test_a_v1_mount_without_our_cpu_line_is_not_read(tmp_path):
    host = FakeHost(tmp_path, f"29 25 0:27 / {tmp_path}/cpu rw - cgroup cgroup rw,cpu\n")
    host.place("0::/\n")
    host.stat("cpu", 10, 5)
    reader = CgroupThrottling(str(host.proc))
    assert reader.ratio() is None and reader.ratio() is None


@pytest.mark.parametrize("throttled, share", [(0, 0.0), (1, 1.0)])
def test_one_period_between_readings_counts(host, throttled, share):
    host.place("0::/a\n")
    host.stat("cg/a", 10, 2)
    reader = CgroupThrottling(str(host.proc))
    reader.ratio()
    host.stat("cg/a", 11, 2 + throttled)
    assert reader.ratio() == share


def test_the_share_never_passes_every_period(host):
    """A cgroup removed and made again at the same path between readings: counts that do
    not follow on. The share is still at most 1."""
    host.place("0::/a\n")
    host.stat("cg/a", 100, 5)
    reader = CgroupThrottling(str(host.proc))
    reader.ratio()
    host.stat("cg/a", 110, 40)
    assert reader.ratio() == 1.0
