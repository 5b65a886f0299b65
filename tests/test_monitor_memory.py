"""Memory figures: RSS on CPU; the CUDA allocator's statistics (faked here: no GPU) on CUDA."""

from __future__ import annotations

import resource
import types

import psutil
import torch

from fsdpmon.monitor.memory import MemoryReader


def test_cpu_reports_process_rss():
    process = psutil.Process()
    before = process.memory_info().rss
    stats = MemoryReader(cuda=False).read()
    after = process.memory_info().rss
    # RSS counts whole pages: between the two reads around it, give or take the page the
    # reader's own call may touch
    page = resource.getpagesize()
    assert min(before, after) - page <= stats.peak_bytes <= max(before, after) + page, (
        before, stats.peak_bytes, after)
    assert set(stats.values) == {"fsdpmon_train_process_rss_bytes"}


def test_cuda_allocator_statistics_per_window(monkeypatch):
    # torch.cuda.memory_stats() keys, as the caching allocator names them.
    stats = {"allocated_bytes.all.current": 3e9, "reserved_bytes.all.current": 4e9,
             "active_bytes.all.peak": 3.5e9, "reserved_bytes.all.peak": 4.5e9,
             "num_alloc_retries": 2, "num_ooms": 1}
    resets = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(total_memory=80e9))
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda: dict(stats))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: resets.append(1))
    reader = MemoryReader(cuda=True)
    read = reader.read()
    assert read.peak_bytes == 3.5e9
    assert reader.capacity == 80e9
    assert read.values["fsdpmon_train_memory_allocated_bytes"] == 3e9
    assert read.values["fsdpmon_train_memory_reserved_bytes"] == 4e9
    assert read.values["fsdpmon_train_memory_peak_reserved_bytes"] == 4.5e9
    assert read.values["fsdpmon_train_alloc_retries_total"] == 2
    assert read.values["fsdpmon_train_ooms_total"] == 1
    assert read.values["fsdpmon_train_device_memory_capacity_bytes"] == 80e9
    assert resets == [1]  # peaks are per log window
