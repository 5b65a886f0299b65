"""Signal handlers that cannot deadlock (issue 52): every handler in the tree, signalled twice.

- ``fsdpmon.signals.Catcher``: a signal sets the flag and wakes ``wait`` at once; the second is
  harmless, the third ends the process (128 + the signal), never with ``force_after=None``.
- A second signal forced inside the first handler, at each call the handler makes in turn
  (``signal_reentry.py``): the old ``Event.set`` handler hangs there, the Catcher and the pod
  server's own ``main`` go on and exit.
- Twice each: SIGTERM to the pod server, to a rank's exit clean-up, to the exporter and to the
  demo; SIGWINCH (and a burst) to ``top``'s loop in a terminal.
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from support import free_port

from fsdpmon.monitor import podserver
from fsdpmon.monitor.state import RankStateWriter
from fsdpmon.signals import FORCE_AFTER, WAKE_S, Catcher

# quiet: its processes mostly wait (21.7 s of wall, 7.0 s of CPU alone, /usr/bin/time, 2-core VM)
pytestmark = pytest.mark.quiet

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PYTHONUNBUFFERED": "1"}
RANKS_PER_NODE = 8  # an 8-GPU node's local ranks
# Between the ranks' signals: a signal sent while the same one is pending is merged with it, so
# back-to-back kills reach a process as one or two; ranks closing apart send each of theirs.
SIGNAL_GAP_S = 0.025


def _script(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=ENV, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _ready(proc: subprocess.Popen, word: str = "ready") -> None:
    line = proc.stdout.readline()
    assert line.strip() == word, (line, proc.stderr.read() if proc.poll() is not None else "")


def _twice(pid: int, sig: int = signal.SIGTERM) -> None:
    """The same signal twice within 10 ms, as two ranks closing at once send it."""
    os.kill(pid, sig)
    os.kill(pid, sig)


def test_a_signal_sets_the_flag_and_wakes_the_waiter_and_restore_puts_the_old_back():
    before = signal.getsignal(signal.SIGUSR1)
    with Catcher((signal.SIGUSR1,)) as catcher:
        assert not catcher.wait(0) and catcher.take() == 0
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert catcher.wait(5) and time.monotonic() - sent < 1.0
        assert catcher.caught and catcher.received == [signal.SIGUSR1]
        assert select.select([catcher.fileno()], [], [], 0)[0] == []  # drained by wait
        os.kill(os.getpid(), signal.SIGUSR1)
        assert catcher.take() == 2 and catcher.take() == 0 and not catcher.caught
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_signal_another_thread_takes_still_ends_the_wait_within_its_wake_up():
    """The kernel may hand a process's signal to any thread: sent to a helper thread here
    (``pthread_kill``), it does not interrupt the main thread's ``select``, and its handler runs
    only once the main thread runs Python again. The wait wakes every WAKE_S for that."""
    with Catcher((signal.SIGUSR1,), force_after=None) as catcher:
        helper = threading.Thread(target=lambda: (
            time.sleep(0.2), signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)))
        began = time.monotonic()
        helper.start()
        caught = catcher.wait(30)
        took = time.monotonic() - began
        helper.join()
    # 0.2 s before the signal, then at most one WAKE_S: far from the 30 s it would wait out
    assert caught and took < 0.2 + WAKE_S + 2.0, f"the wait took {took:.2f} s (caught: {caught})"


@pytest.mark.parametrize("force_after, sent, alive", [
    (FORCE_AFTER, FORCE_AFTER - 1, True), (FORCE_AFTER, FORCE_AFTER, False), (None, 6, True)])
def test_the_third_signal_ends_the_process_unless_forcing_is_off(force_after, sent, alive):
    proc = _script(f"""
        import os, select, signal
        from fsdpmon.signals import Catcher
        catcher = Catcher((signal.SIGTERM,), force_after={force_after}).install()
        print("ready", flush=True)
        while True:  # an orderly close that never ends: only a forced exit ends it
            if select.select([catcher.fileno()], [], [], 1)[0]:
                os.read(catcher.fileno(), 1)
                print("got", len(catcher.received), flush=True)
    """)
    try:
        _ready(proc)
        for n in range(1, sent + 1):
            os.kill(proc.pid, signal.SIGTERM)
            if n < FORCE_AFTER or force_after is None:
                assert proc.stdout.readline().split() == ["got", str(n)]  # one at a time
        if alive:
            time.sleep(0.5)
            assert proc.poll() is None
        else:
            assert proc.wait(timeout=5) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def _reentry(mode: str, *args: str, timeout_s: float) -> tuple[int | None, str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "signal_reentry.py"), mode,
                             *args], env=ENV, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.kill()  # SIGKILL: a handler deadlocked in SIGTERM's own handler ignores SIGTERM
        out, _ = proc.communicate()
        return None, out


def test_a_second_signal_inside_the_first_handler_at_any_point_is_harmless():
    code, out = _reentry("catcher", timeout_s=30)
    assert code == 0 and "done" in out, out
    # The harness catches the old pattern: Event.set re-entered inside itself never returns.
    code, out = _reentry("event", timeout_s=5)
    assert code is None and "done" not in out, out


@pytest.mark.slow
def test_the_pod_server_exits_with_a_second_signal_inside_its_first_handler(tmp_path):
    base = tmp_path / "state"
    base.mkdir(mode=0o700)
    code, out = _reentry("podserver", str(base), str(free_port()), timeout_s=60)
    assert code == 0 and "done" in out, out[-3000:]
    rounds = int(out.split("done")[-1].split()[0])
    assert rounds >= 3, out[-3000:]  # the handler makes calls: every one was a re-entry point


def test_the_pod_server_stops_in_order_on_a_sigterm_from_every_rank_of_a_node(tmp_path):
    # Eight local ranks closing at once each find no other rank left and each send SIGTERM:
    # that must not be read as an impatient user's third signal, which ended the server
    # before its close and left its lock file behind.
    directory = tmp_path / "job"
    directory.mkdir(mode=0o700)
    writer = RankStateWriter(directory, 0)  # a live rank: this process
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", podserver.MODULE, "--dir", str(directory),
                             "--job-name", "twice", "--address", "127.0.0.1", "--port",
                             str(port), "--foreground"], env=ENV, cwd=REPO,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not podserver.running(directory):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        for _ in range(RANKS_PER_NODE):  # each rank that finds itself last sends one
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            time.sleep(SIGNAL_GAP_S)
        # 0, or the default action of a SIGTERM that came after the close restored it; not
        # 128 + SIGTERM, the forced end
        assert proc.wait(timeout=10) in (0, -signal.SIGTERM), (proc.returncode,
                                                               proc.stderr.read())
        assert not (directory / podserver.LOCK_NAME).exists()
    finally:
        proc.kill()
        proc.wait()
        writer.close(remove=False)


def test_a_ranks_sigterm_clean_up_runs_once_on_sigterm_twice(tmp_path):
    said = tmp_path / "cleaned"
    proc = _script(f"""
        import time
        from fsdpmon.monitor import exit_cleanup
        exit_cleanup.register(lambda: open({str(said)!r}, "a").write("cleaned\\n"))
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """)
    try:
        _ready(proc)
        _twice(proc.pid)
        assert proc.wait(timeout=10) == -signal.SIGTERM, proc.stderr.read()
        assert said.read_text() == "cleaned\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_sigterm_during_a_ranks_start_up_leaves_none_of_its_files(tmp_path):
    """SIGTERM after the rank made its heartbeat and exit record, before it registered their
    clean-ups (what torchrun's stop during start-up hit: ``rank1.hb`` and both exit records
    outlived the job). Forced there by a hook; the clean-ups wait for the start-up to finish
    registering, then remove everything."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, signal, time
        from fsdpmon.monitor import Monitor, MonitorConfig, exit_record
        made = exit_record.ExitRecord.__init__
        def stopped_here(self, *args):
            made(self, *args)
            os.kill(os.getpid(), signal.SIGTERM)  # the stop, between the files and clean-ups
            time.sleep(0.3)  # handled here; nothing registered yet
        exit_record.ExitRecord.__init__ = stopped_here
        Monitor(MonitorConfig.from_env(), tokens_per_step=1, total_steps=10)
        time.sleep(30)
    """)], env={**ENV, "FSDPMON_STATE_DIR": str(tmp_path), "FSDPMON_PORT": str(port),
                "FSDPMON_JOB_NAME": "startup", "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
                "FSDPMON_SERVER_RETRY_SECONDS": "30", "RANK": "1", "LOCAL_RANK": "1",
                "WORLD_SIZE": "2"}, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.wait(timeout=30) == -signal.SIGTERM, proc.stderr.read()
        left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
        assert left == [], left
    finally:
        proc.kill()
        proc.wait()


def test_the_exporter_stops_once_on_sigterm_twice():
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(free_port()),
         "--listen-address", "127.0.0.1", "--interval", "1", "--simulate-gpus", "1"],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        log = ""
        while "serving" not in log:
            line = proc.stdout.readline()
            assert line, log
            log += line
        _twice(proc.pid)
        assert proc.wait(timeout=15) == 0
        log += proc.stdout.read()
        assert log.count("stopping") == 1 and "Traceback" not in log, log
    finally:
        proc.kill()
        proc.wait()


DEMO_STUB = """
    import argparse, sys, time
    import fsdpmon.demo as demo

    class Session:  # the demo's processes, stood in for: what matters is its signals
        def __init__(self, plan, say): pass
        def start(self): print("ready", flush=True)
        def wait_ready(self, n, timeout): time.sleep(600)
        def stop(self):
            print("stopping", flush=True)
            time.sleep(1.0)  # a second signal lands here: it must not cut this short
            print("stopped", flush=True)

    demo.Session = Session
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    try:
        demo.run(parser.parse_args(["--headless", "--log-dir", sys.argv[1]]))
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_the_demo_stops_once_and_whole_on_sigterm_twice(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(DEMO_STUB), str(tmp_path)],
                            env=ENV, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _ready(proc)
        os.kill(proc.pid, signal.SIGTERM)
        _ready(proc, "stopping")
        _twice(proc.pid)  # during the clean-up, twice more
        assert proc.wait(timeout=15) == 130, proc.stderr.read()
        assert proc.stdout.read().split() == ["stopped"]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_top_keeps_answering_through_sigwinch_twice_and_a_burst():
    pid, fd = pty.fork()
    if pid == 0:  # the child: `fsdpmon top` in a terminal, watching a target that is not there
        os.execve(sys.executable, [sys.executable, "-m", "fsdpmon.cli", "top", "--targets",
                                   f"127.0.0.1:{free_port()}", "--interval", "1"], ENV)
    out = b""
    try:
        out = _read_until(fd, out, 60)
        _twice(pid, signal.SIGWINCH)
        for _ in range(50):  # a window edge dragged
            os.kill(pid, signal.SIGWINCH)
        time.sleep(0.5)
        os.write(fd, b"q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, out[-2000:]
                return
            out = _read_until(fd, out, 0.2)
        raise AssertionError(f"top did not quit after SIGWINCH: {out[-2000:]!r}")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def _read_until(fd: int, out: bytes, seconds: float) -> bytes:
    """Read the terminal for ``seconds``, or until the first screen when ``out`` is empty."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
            if seconds > 1 and len(out) > 200:
                break
    return out
