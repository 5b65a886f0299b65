"""The live loop: Ctrl-C restores the terminal, a resize redraws to the new size, source errors
show as a notice and are retried with backoff (the last snapshot stays on screen)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from payload_server import PayloadServer
from synthetic_job import job_expositions

from fsdpmon.errors import UnreachableError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.top.app import Refresher, split_keys

REPO = Path(__file__).resolve().parents[1]


def test_typed_ahead_keys_are_all_handled():
    assert split_keys("1>i") == ["1", ">", "i"]
    assert split_keys("\x1b[A2\x1b") == ["\x1b[A", "2", "\x1b"]
    assert split_keys("\x1b[15~q") == ["\x1b[15~", "q"]


class FlakySource:
    description = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def fetch(self) -> JobSnapshot:
        self.calls += 1
        if self.calls in (2, 3):
            raise UnreachableError("Prometheus at http://p: connection refused")
        return JobSnapshot(time=float(self.calls), source="flaky")

    def close(self) -> None:
        pass


def test_refresher_keeps_the_last_snapshot_and_backs_off():
    source = FlakySource()
    refresher = Refresher(source, interval_s=0.05)
    refresher.start()
    try:
        deadline = time.monotonic() + 10
        seen = []
        while source.calls < 4 and time.monotonic() < deadline:
            latest = refresher.current()
            seen.append((latest.snapshot.time if latest.snapshot else None, latest.notice))
            time.sleep(0.01)
    finally:
        refresher.stop.set()
        refresher.join(timeout=5)
    notices = [n for _, n in seen if n]
    assert notices and "connection refused (retrying in" in notices[0]
    assert all(t == 1.0 for t, n in seen if n)  # the last good snapshot stays on screen
    assert source.calls >= 4  # recovered after the backoff


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          timeout=20).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
@pytest.mark.timeout(90)
def test_ctrl_c_restores_the_terminal_and_resize_redraws(tmp_path):
    server = PayloadServer(job_expositions("llama", 1, 2))
    sock = f"fsdpmon-app-{uuid.uuid4().hex[:8]}"
    urls = ",".join(server.url(p) for p in sorted(server.payloads))
    script = tmp_path / "run.sh"
    script.write_text(
        # a trap (not an ignore: children would inherit that) keeps the shell alive on Ctrl-C
        f"trap 'true' INT\ncd {REPO}\nstty -a > {tmp_path}/before\n"
        f"{sys.executable} -m fsdpmon.cli top --targets {urls} --interval 0.3\n"
        f"echo $? > {tmp_path}/rc\nstty -a > {tmp_path}/after\nsleep 30\n")
    try:
        _tmux(sock, "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", f"sh {script}")

        def screen() -> str:
            return _tmux(sock, "capture-pane", "-p", "-t", "t")

        deadline = time.monotonic() + 30
        while "RUNNING" not in screen() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "RUNNING" in screen()
        _tmux(sock, "resize-window", "-t", "t", "-x", "80", "-y", "24")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            lines = screen().rstrip("\n").split("\n")
            if len(lines) <= 24 and "2 ranks" in "\n".join(lines):
                break
            time.sleep(0.2)
        assert "2 ranks · sorted by RANK" in "\n".join(lines) and len(lines) <= 24
        _tmux(sock, "send-keys", "-t", "t", "C-c")
        deadline = time.monotonic() + 15
        while not (tmp_path / "after").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "rc").read_text().strip() == "130"
        before, after = (tmp_path / "before").read_text(), (tmp_path / "after").read_text()
        words = set(after.replace(";", " ").split())
        words_before = set(before.replace(";", " ").split())
        for flag in ("icanon", "echo", "isig"):  # cbreak mode turned these off; all back on
            assert (flag in words) == (flag in words_before) and flag in words
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=20)
        server.close()
