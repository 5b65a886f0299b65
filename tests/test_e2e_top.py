"""`fsdpmon top` used as a person would: a real 2-rank CPU training with the monitor, the exporter
with simulated GPUs, top running in a tmux pane; keys switch views and sort; SIGSTOP of one rank
shows STALLED within the monitor's bound, SIGCONT clears it; `q` quits cleanly."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from fsdpmon.scrape.sources.targets import TargetsSource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]

STALL_FLOOR_S = 4.0  # the monitor's stall threshold here: max(10 x median step, this floor)
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, check, timeout_s: float, every_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


class Tmux:
    """A private tmux server (its own socket), so parallel tests never share sessions."""

    def __init__(self) -> None:
        self.socket = f"fsdpmon-top-{uuid.uuid4().hex[:8]}"

    def __call__(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                             text=True, timeout=20)
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def wait_for(self, text: str, timeout_s: float = 30) -> str:
        return _wait(f"{text!r} on screen", lambda: text in (s := self.screen()) and s,
                     timeout_s)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=20)


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.send_signal(signal.SIGCONT)
            p.kill()
        except psutil.NoSuchProcess:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _rank_pid(torchrun: subprocess.Popen, rank: int) -> int:
    for child in psutil.Process(torchrun.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "fsdpmon.trainer.train" in " ".join(
                    child.cmdline()):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return 0


def _rank_rows(screen: str) -> list[str]:
    return [line for line in screen.split("\n")
            if line.replace("▸", " ").split()[:1] in (["0"], ["1"]) and "127.0.0.1" in line]


def _selected(screen: str) -> str:
    """The rank the selection marker (▸) is on."""
    marked = [line for line in screen.split("\n") if "▸" in line]
    return marked[0].split("▸", 1)[1].split()[0] if len(marked) == 1 else ""


def _navigate(tmux: Tmux) -> None:
    """As an htop/k9s user would: move, open a rank and come back, filter as you type, help."""
    tmux("send-keys", "-t", "top", "Home")
    _wait("the selection on the first row", lambda: _selected(tmux.screen()), 10)
    first = _selected(tmux.screen())
    other = "1" if first == "0" else "0"
    tmux("send-keys", "-t", "top", "Down")
    _wait(f"the selection to move to rank {other}", lambda: _selected(tmux.screen()) == other,
          10)
    tmux("send-keys", "-t", "top", "Enter")
    screen = tmux.wait_for(f"› rank {other}")
    assert f"rank {other}  node " in screen and "step time" in screen, screen
    tmux("send-keys", "-t", "top", "Escape")
    _wait("the ranks again, the same row selected",
          lambda: "› rank" not in (s := tmux.screen()) and _selected(s) == other, 10)
    tmux("send-keys", "-t", "top", "/", "z", "z")  # no Enter: the rows go as the text comes
    screen = tmux.wait_for("0 ranks")
    assert "filter 'zz'" in screen and not _rank_rows(screen), screen
    tmux("send-keys", "-t", "top", "Escape")
    _wait("the filter gone", lambda: len(_rank_rows(tmux.screen())) == 2, 10)
    tmux("send-keys", "-t", "top", "?")
    tmux.wait_for("Esc  Backspace")
    tmux("send-keys", "-t", "top", "Escape")
    _wait("help closed", lambda: "Esc  Backspace" not in (s := tmux.screen())
          and len(_rank_rows(s)) == 2, 10)


def test_top_in_tmux_follows_a_real_training(tmp_path):
    train_port, exporter_port = _free_port(), _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "FSDPMON_STALL_FLOOR_SECONDS": str(STALL_FLOOR_S), "PYTHONUNBUFFERED": "1"}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(exporter_port),
         "--listen-address", "127.0.0.1", "--interval", "1", "--simulate-gpus", "2"],
        cwd=REPO, env=env, stdout=open(tmp_path / "exporter.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT, start_new_session=True)
    trainer = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "fsdpmon.trainer.train", "--model", "tiny", "--max-steps", "100000",
         "--batch-size", "2",
         "--seq-len", "32", "--log-every", "1", "--metrics-port", str(train_port),
         "--job-name", "e2e-top"],
        cwd=REPO, env=env, stdout=open(tmp_path / "train.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT, start_new_session=True)
    tmux = Tmux()
    urls = f"127.0.0.1:{train_port},127.0.0.1:{exporter_port}"
    try:
        source = TargetsSource(urls.split(","), timeout_s=2.0)

        def both_ranks_stepping():
            snap = source.fetch()
            return len(snap.ranks) == 2 and all((r.step or 0) > 2 for r in snap.ranks) \
                and len(snap.gpus) == 2

        _wait("both ranks and the exporter", both_ranks_stepping, 150, 1.0)
        source.close()

        tmux("new-session", "-d", "-s", "top", "-x", "100", "-y", "30",
             f"cd {REPO} && {sys.executable} -m fsdpmon.cli top --targets {urls} "
             f"--interval 0.5 2> {tmp_path / 'top.err'}; echo $? > {tmp_path / 'top.exit'}")
        tmux("set-option", "-t", "top", "remain-on-exit", "on")
        screen = tmux.wait_for("RUNNING")
        screen = _wait("both rank rows", lambda: len(_rank_rows(s := tmux.screen())) == 2 and s,
                       20)
        assert "job e2e-top" in screen and "world 2" in screen

        tmux("send-keys", "-t", "top", "2")
        screen = tmux.wait_for("HISTORY")
        assert "2 GPUs (SIMULATED) on 1 node" in screen
        tmux("send-keys", "-t", "top", "3")
        tmux.wait_for("COMMAND")
        tmux("send-keys", "-t", "top", "1")
        tmux("send-keys", "-t", "top", ">")  # sort by the next column (POD)
        tmux.wait_for("POD ↑")
        tmux("send-keys", "-t", "top", "i")
        tmux.wait_for("POD ↓")
        _navigate(tmux)

        rank1 = _rank_pid(trainer, 1)
        assert rank1, "rank 1 not found among torchrun's children"
        source = TargetsSource(urls.split(","), timeout_s=2.0)
        step = max(r.step_time_s or 0.0 for r in source.fetch().ranks)
        source.close()
        os.kill(rank1, signal.SIGSTOP)
        stopped = time.monotonic()
        # a generous deadline: the threshold, the watchdog's tick, a scrape and a redraw
        screen = tmux.wait_for("STALLED", timeout_s=STALL_FLOOR_S + 20)
        # Never before the threshold (max(10 x median step, floor) >= the floor) has passed
        # since a rank's last progress, which is at most one step after the stop (rank 0 may
        # finish the step it is in; a step is as long as it was served just before).
        took = time.monotonic() - stopped
        assert took >= STALL_FLOOR_S - step, f"STALLED {took:.2f}s after the stop, step {step}"
        assert "stalled" in screen

        os.kill(rank1, signal.SIGCONT)
        _wait("STALLED to clear", lambda: "STALLED" not in (s := tmux.screen()) and s, 30)

        tmux("send-keys", "-t", "top", "q")

        # The shell in the pane writes top's exit status to a file: tmux's own record of it
        # (#{pane_dead_status}) is sometimes missing, which made this check flaky.
        exit_file = tmp_path / "top.exit"
        status = _wait("top to exit", lambda: exit_file.exists() and exit_file.read_text(), 20)
        assert status.strip() == "0", (status, (tmp_path / "top.err").read_text()[-3000:])
    finally:
        tmux.kill()
        _kill_tree(trainer)
        _kill_tree(exporter)
