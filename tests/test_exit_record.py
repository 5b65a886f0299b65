"""How a rank's previous life ended, told by its restarted process: real monitor processes in
a torchrun worker's environment (RANK, LOCAL_RANK, TORCHELASTIC_RESTART_COUNT), two ranks of a
node sharing one state directory.

- rank 1 SIGKILLed and rank 0 stopped with SIGTERM (what torchrun's agent does when a worker
  dies): rank 1's restarted process serves how its previous life ended (killed, with its last
  log step), rank 0's record says sigterm; once rank 1 finishes normally nothing is left behind,
  so a later launch has nothing to misread (a new launcher's first start reads no record);
- a loop that raises ends its record as an error.
A rank stopped with SIGTERM when nobody was killed (`kill -TERM` of torchrun) leaves nothing
behind either: test_monitor_statedir's SIGTERM case, which goes through the same clean-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from support import free_port

from fsdpmon import catalog
from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.monitor.exit_cleanup import MAIN_THREAD_GRACE_SECONDS
from fsdpmon.monitor.exit_record import (
    ExitRecord,
    PreviousExit,
    read_previous,
    record_path,
    sweep,
)
from fsdpmon.monitor.state import job_state_dir

REPO = Path(__file__).resolve().parents[1]
JOB = "exits"


def _rank(base: Path, port: int, rank: int, restart: int, seconds: float,
          script: tuple[str, ...] = ()) -> subprocess.Popen:
    """A monitored process as rank ``rank``: monitor_idle.py, or ``script`` (a file in tests/
    and its arguments)."""
    env = {**os.environ, "FSDPMON_STATE_DIR": str(base), "FSDPMON_PORT": str(port),
           "FSDPMON_JOB_NAME": JOB, "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
           "FSDPMON_LOG_INTERVAL": "5", "FSDPMON_SERVER_RETRY_SECONDS": "0.2",
           "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
           "TORCHELASTIC_RESTART_COUNT": str(restart), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    argv = [str(REPO / "tests" / script[0]), *script[1:]] if script else [
        str(REPO / "tests" / "monitor_idle.py"), str(seconds)]
    return subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _group(base: Path, port: int, restart: int, seconds: float = 60.0,
           ranks: tuple[int, ...] = (0, 1)) -> list[subprocess.Popen]:
    procs = [_rank(base, port, r, restart, seconds) for r in ranks]
    for p in procs:
        line = p.stdout.readline()
        assert line.strip() == "ready", (line, p.stderr.read() if p.poll() is not None else "")
    return procs


def _exits(port: int, ranks: int,
           timeout_s: float = 15.0) -> tuple[dict[str, tuple[str, float]], str]:
    """rank → (how, step) from the node's endpoint, once ``ranks`` ranks' series are served,
    and the exposition."""
    name = catalog.TRAIN_PREVIOUS_EXIT.name
    deadline = time.monotonic() + timeout_s
    text = ""
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:  # the port changing hands as the ranks start: ask again
            pass
        how = {labels["rank"]: labels["how"] for labels, _ in _series(text, name)}
        step = {labels["rank"]: value
                for labels, value in _series(text, catalog.TRAIN_PREVIOUS_EXIT_STEP.name)}
        if len(how) == ranks or time.monotonic() > deadline:
            return {r: (h, step.get(r, -1.0)) for r, h in how.items()}, text
        time.sleep(0.3)


def _recorded_step(directory: Path, rank: int) -> float:
    try:
        return float(json.loads(record_path(directory, rank).read_text()).get("step") or 0)
    except (OSError, ValueError):
        return 0.0


def _series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            block, value = line[len(name) + 1:].rsplit("} ", 1)
            out.append((dict(re.findall(r'(\w+)="([^"]*)"', block)), float(value)))
    return out


@pytest.mark.slow
def test_a_restarted_rank_says_how_its_previous_life_ended_and_nothing_is_left(tmp_path):
    port = free_port()
    directory = job_state_dir(JOB, port, str(tmp_path))
    procs = _group(tmp_path, port, restart=0)
    try:
        # a few log steps: both records hold a step (polled, generously)
        deadline = time.monotonic() + 30
        while min(_recorded_step(directory, r) for r in (0, 1)) < 5:
            assert time.monotonic() < deadline, "no log step recorded in 30 s"
            time.sleep(0.05)
        procs[1].send_signal(signal.SIGKILL)
        assert procs[1].wait(timeout=20) == -signal.SIGKILL
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=20) == -signal.SIGTERM, procs[0].stderr.read()
        # a first start (a new launcher) reads none of it
        assert read_previous(directory, 1, 0, time.time()) is None
        stopped = read_previous(directory, 0, 1, time.time())  # what restarted rank 0 would say
        assert stopped is not None and (stopped.how, stopped.step >= 5) == ("sigterm", True), (
            stopped)
        procs = _group(tmp_path, port, restart=1, seconds=3.0, ranks=(1,))  # rank 1 restarted
        said, text = _exits(port, ranks=1)
        if shutil.which("promtool"):
            check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                                   capture_output=True, timeout=30)
            assert check.returncode == 0, check.stdout + check.stderr
        assert said.keys() == {"1"} and said["1"][0] == "killed", said
        assert said["1"][1] >= 5, f"its last log step: {said}"
        # it finishes normally, the last rank out: every record goes, and the directory too
        assert procs[0].wait(timeout=30) == 0, procs[0].stderr.read()
        assert not directory.exists(), list(directory.iterdir())
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _doc(directory: Path, rank: int) -> dict:
    return json.loads(record_path(directory, rank).read_text())


def test_a_record_tells_the_next_incarnation_how_this_one_ended(tmp_path):
    """Fast, in one process: what each record says, and what a restarted rank reads of it."""
    record = ExitRecord(tmp_path, 1, restart_count=0)
    assert _doc(tmp_path, 1)["how"] == "running" and _doc(tmp_path, 1)["step"] == 0.0
    assert read_previous(tmp_path, 1, 1, now=50.0) == PreviousExit("killed", 0.0, 50.0)
    progressed = time.time()
    record.progress(5)
    progressed_by = time.time()
    assert _doc(tmp_path, 1)["step"] == 5
    assert read_previous(tmp_path, 1, 0, now=50.0) is None, "a first start reads nothing"
    killed = read_previous(tmp_path, 1, 1, now=50.0)
    # the time of its last log step: where goodput's restart is counted from
    assert progressed <= killed.last_progress <= progressed_by, killed
    assert killed == PreviousExit("killed", 5.0, 50.0, last_progress=killed.last_progress)
    before = time.time()
    record.end("sigterm", step=9)
    after = time.time()
    said = read_previous(tmp_path, 1, 1, now=50.0)
    assert (said.how, said.step) == ("sigterm", 9.0) and before <= said.unix <= after, said
    assert said.last_progress == killed.last_progress, "the last step's time outlives the end"
    record.end("error", step=10, detail="RuntimeError")  # the first ending wins
    record.progress(12)  # and nothing moves it after
    assert (_doc(tmp_path, 1)["how"], _doc(tmp_path, 1)["step"]) == ("sigterm", 9)
    assert read_previous(tmp_path, 1, 2, now=50.0).how == "sigterm", "any earlier restart's"
    fresh = ExitRecord(tmp_path, 2, restart_count=0)
    fresh.end("error", detail="x" * 200)  # no step: its last one, 0
    said = read_previous(tmp_path, 2, 1, now=50.0)
    assert (said.how, said.step, said.detail) == ("error", 0.0, "x" * 80), said


@pytest.mark.parametrize("restart, reader, read", [
    (0, 1, True), (1, 1, False), (2, 1, False),  # a later launcher's record: not ours
    (-1, 1, False), (None, 1, False), ("0", 1, False), (True, 1, False), (float("nan"), 1, False),
])
def test_only_an_earlier_restarts_record_is_read(tmp_path, restart, reader, read):
    doc = {"pid": 1, "how": "sigterm", "step": 3, "time": 20.0, "detail": ""}
    if restart is not None:
        doc["restart"] = restart
    record_path(tmp_path, 0).write_text(json.dumps(doc))
    said = read_previous(tmp_path, 0, reader, now=50.0)
    assert (said == PreviousExit("sigterm", 3.0, 20.0)) if read else said is None, said


def test_the_last_rank_out_removes_the_records_unless_one_tells_of_a_death(tmp_path):
    for rank, how in enumerate(("sigterm", "error")):
        ExitRecord(tmp_path, rank, 0).end(how)
    (tmp_path / "rank7.exit").write_text("[1, 2]")  # not a record: says nothing
    sweep(tmp_path)
    assert not list(tmp_path.glob("rank*.exit")), list(tmp_path.iterdir())
    ExitRecord(tmp_path, 0, 0).end("sigterm")
    ExitRecord(tmp_path, 1, 0)  # still "running": a live rank, or a killed one
    sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("rank*.exit")) == ["rank0.exit", "rank1.exit"]


def _read_syscall_number() -> str:
    """The number /proc gives a thread blocked in read(2) on this machine: one of ours."""
    r, w = os.pipe()
    reader = threading.Thread(target=os.read, args=(r, 1))
    reader.start()
    try:
        return _wait_blocked(f"/proc/self/task/{reader.native_id}/syscall", r)
    finally:
        os.write(w, b"x")
        reader.join()
        os.close(r)
        os.close(w)


def _wait_blocked(path: str, fd: int, number: str | None = None) -> str:
    """Wait until the thread whose /proc syscall file is ``path`` is blocked in a call whose
    first argument is ``fd`` (and whose number is ``number``, when given); its number."""
    deadline = time.monotonic() + 20
    while True:
        try:
            fields = Path(path).read_text().split()
        except OSError as exc:  # no CONFIG_HAVE_ARCH_TRACEHOOK, or not ours to read
            pytest.skip(f"cannot see where a thread is blocked: {exc}")
        if len(fields) > 1 and fields[1] == hex(fd) and number in (None, fields[0]):
            return fields[0]
        assert time.monotonic() < deadline, f"never blocked reading fd {fd}: {fields}"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("mode, said, status, how", [
    # the main thread's handler ends it; the record's lock stays held by the hung write, so
    # the clean-up that ends the record is given up on after its bound: read as killed
    ("in-record", "writing", -signal.SIGTERM, "killed"),
    ("stuck", "stuck", 128 + signal.SIGTERM, "sigterm"),  # the watcher thread, after the grace
])
def test_sigterm_at_an_awkward_moment_still_ends_the_record_and_the_process(
        tmp_path, mode, said, status, how):
    """SIGTERM while the training thread holds the exit record's lock (a slow write), or while
    it never returns to the interpreter (a collective): the process ends, its state files are
    gone, and its record says sigterm unless a hung write held it. Rank 0 keeps running, so the
    records stay to read."""
    port = free_port()
    directory = job_state_dir(JOB, port, str(tmp_path))
    procs = _group(tmp_path, port, restart=0, ranks=(0,))
    subject = _rank(tmp_path, port, 1, 0, 0.0, script=("monitor_sigterm.py", mode))
    procs.append(subject)
    try:
        line = subject.stdout.readline()
        assert line.split()[:1] == [said], (line, subject.stderr.read() if subject.poll() else "")
        if mode == "stuck":  # in C for good, before the signal: it never reaches the handler
            _wait_blocked(f"/proc/{subject.pid}/task/{subject.pid}/syscall", int(line.split()[1]),
                          _read_syscall_number())
        assert (directory / "rank1.hb").exists(), list(directory.iterdir())
        sent = time.monotonic()
        subject.send_signal(signal.SIGTERM)
        assert subject.wait(timeout=20) == status, subject.stderr.read()
        took = time.monotonic() - sent
        err = subject.stderr.read()
        assert "Traceback" not in err, err  # no thread tripped over the clean-up
        if mode == "stuck":  # the main thread was given its chance first
            assert took >= MAIN_THREAD_GRACE_SECONDS, f"{took:.3f} s"
        ended = read_previous(directory, 1, 1, time.time())
        assert ended is not None and ended.how == how, ended
        left = sorted(p.name for p in directory.iterdir())
        assert not {"rank1.hb", "rank1.json"} & set(left), left
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_loop_that_raises_ends_its_record_as_an_error(tmp_path):
    port = free_port()
    config = MonitorConfig(port=port, job_name=JOB, state_dir=str(tmp_path),
                           listen_address="127.0.0.1")
    directory = job_state_dir(JOB, port, str(tmp_path))
    killed = None
    with pytest.raises(RuntimeError):
        mon = Monitor(config, tokens_per_step=1)
        killed = ExitRecord(directory, 1, 0)  # a peer still "running": the records stay
        try:
            for _ in range(3):
                with mon.step():
                    pass
            raise RuntimeError("Connection closed by peer")
        finally:
            mon.close()
    assert killed is not None
    ended = read_previous(directory, 0, 1, time.time())
    assert ended is not None and (ended.how, ended.step, ended.detail) == (
        "error", 3.0, "RuntimeError"), ended
    record_path(directory, 1).unlink()
