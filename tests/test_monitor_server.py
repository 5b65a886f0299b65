"""One endpoint per pod: whoever holds the port serves; another rank takes over when it goes."""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request

from support import free_port

from fsdpmon.monitor.server import PortKeeper
from fsdpmon.monitor.state import RankStateWriter


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def _wait(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _refused(caplog) -> bool:
    """A keeper has tried the port and found it held (it says so once, then retries)."""
    return any("not available" in r.getMessage() for r in caplog.records)


def test_second_keeper_takes_the_port_over_when_the_first_closes(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fsdpmon.monitor.server")
    writer = RankStateWriter(tmp_path, 0)
    writer.snapshot({"pid": os.getpid(), "rank": 0, "local_rank": 0, "job_name": "j",
                     "values": {"fsdpmon_train_loss": 3.5}})
    writer.heartbeat(time.time(), 1, 1, 1, 0, 60)
    port = free_port()
    first = PortKeeper(tmp_path, "127.0.0.1", port, first_try_delay=0, retry_seconds=0.2)
    second = PortKeeper(tmp_path, "127.0.0.1", port, first_try_delay=0.3, retry_seconds=0.2)
    try:
        first.start()
        assert _wait(lambda: first.serving)
        second.start()
        assert _wait(lambda: _refused(caplog)), "the second keeper never tried the port"
        assert not second.serving  # the port is held
        assert 'fsdpmon_train_loss{job_name="j",local_rank="0",rank="0"} 3.5' in _get(port)
        first.close()
        assert _wait(lambda: second.serving)
        assert "fsdpmon_train_loss" in _get(port)
    finally:
        first.close()
        second.close()
        writer.close()


def test_a_port_held_by_another_process_is_retried_not_fatal(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fsdpmon.monitor.server")
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    keeper = PortKeeper(tmp_path, "127.0.0.1", port, first_try_delay=0, retry_seconds=0.1)
    try:
        keeper.start()
        assert _wait(lambda: _refused(caplog)), "the keeper never tried the port"
        assert not keeper.serving
        blocker.close()
        assert _wait(lambda: keeper.serving)
    finally:
        keeper.close()
        blocker.close()


def test_name_filter_serves_only_the_asked_series(tmp_path):
    """`top` asks with Prometheus's ``name[]``: the monitor answers with those series only."""
    writer = RankStateWriter(tmp_path, 0)
    writer.snapshot({"pid": os.getpid(), "rank": 0, "local_rank": 0, "job_name": "j",
                     "values": {"fsdpmon_train_loss": 3.5, "fsdpmon_train_step": 7}})
    writer.heartbeat(time.time(), 1, 1, 1, 0, 60)
    port = free_port()
    keeper = PortKeeper(tmp_path, "127.0.0.1", port, first_try_delay=0, retry_seconds=0.2)
    try:
        keeper.start()
        assert _wait(lambda: keeper.serving)
        full = _get(port)
        url = f"http://127.0.0.1:{port}/metrics?name%5B%5D=fsdpmon_train_loss"
        with urllib.request.urlopen(url, timeout=5) as resp:
            cut = resp.read().decode()
        samples = [line for line in cut.splitlines() if not line.startswith("#")]
        assert samples == ['fsdpmon_train_loss{job_name="j",local_rank="0",rank="0"} 3.5'], cut
        assert "fsdpmon_train_step" in full and len(cut) < len(full) / 4, (len(cut), len(full))
    finally:
        keeper.close()
        writer.close()
