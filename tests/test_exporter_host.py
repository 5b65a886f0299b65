"""Host CPU, load and memory from a fake /proc tree and from the real one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support import rounded

from fsdpmon.exporters.host import HostReader, busy_share, parse_cpu_times, parse_meminfo

FIXTURE = Path(__file__).parent / "fixtures" / "proc"
TICKS = os.sysconf("SC_CLK_TCK")


def test_fixture_values_in_base_units() -> None:
    sample = HostReader(str(FIXTURE)).read()
    assert sample.cpu_seconds["user"] == rounded(10000 / TICKS)
    assert sample.cpu_seconds["idle"] == rounded(80000 / TICKS)
    assert set(sample.cpu_seconds) == {"user", "nice", "system", "idle", "iowait", "irq",
                                       "softirq", "steal"}
    assert sample.cpu_utilization == {}  # a busy share needs two reads
    assert sample.load == (3.5, 2.25, 1.0)
    assert sample.memory_total_bytes == 2 * 2**30
    assert sample.memory_available_bytes == 2**30
    assert sample.memory_used_bytes == 2**30


def test_busy_share_per_core_and_in_total(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root)
    reader = HostReader(str(root))
    reader.read()
    # cpu0: +300 busy, +100 idle (75%); cpu1: +0 busy, +400 idle (0%); all: 300 of 800.
    (root / "stat").write_text(
        "cpu  10300 200 3000 80500 500 0 100 0 0 0\n"
        "cpu0 5300 100 1500 40100 250 0 50 0 0 0\n"
        "cpu1 5000 100 1500 40400 250 0 50 0 0 0\n"
        "btime 1764480000\n")
    utilization = reader.read().cpu_utilization
    assert utilization == rounded({"all": 300 / 800, "0": 0.75, "1": 0.0})


def test_parsers_tolerate_odd_input() -> None:
    assert parse_cpu_times("intr 1 2 3\n", 100) == {}
    assert parse_meminfo("Garbage\nHugePages_Total:       0\n") == {"HugePages_Total": 0.0}
    assert busy_share({"idle": 5.0}, {"idle": 5.0}) is None


def test_real_proc() -> None:
    reader = HostReader("/proc")
    reader.read()
    sample = reader.read()
    assert sample.memory_total_bytes > sample.memory_available_bytes > 0
    assert sample.cpu_seconds["user"] > 0 and len(sample.load) == 3
