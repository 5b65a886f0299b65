"""The state directory: private to its owner, never written through a symlink, one job per port,
removed on exit (SIGTERM included) and when a job that left it behind is gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import free_port

from fsdpmon.errors import InputError
from fsdpmon.monitor import Monitor, MonitorConfig, statedir
from fsdpmon.monitor.state import RankStateWriter, job_state_dir

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534


@pytest.fixture
def shared_base():
    """A world-writable sticky directory like /dev/shm, reachable by any user."""
    base = Path(tempfile.mkdtemp(prefix="fsdpmon-test-shm."))
    base.chmod(0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _config(base: Path, port: int, job: str = "j") -> MonitorConfig:
    return MonitorConfig(port=port, job_name=job, state_dir=str(base),
                         listen_address="127.0.0.1")


def _as_nobody(script: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    "sh", "-c", script], check=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="a second user needs root and setpriv")
def test_a_directory_forged_by_another_user_is_refused_and_nothing_is_written(shared_base):
    port = free_port()
    forged = job_state_dir("j", port, str(shared_base))
    victim = shared_base / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o666)  # the attack needs the target writable by the trainer, not by nobody
    pid = os.getpid()
    _as_nobody(f"mkdir -m 0777 {forged} && "
               f"echo '{{\"pid\": {pid}, \"rank\": 7, \"job_name\": \"j\"}}' > {forged}/rank7.json"
               f" && ln -s {victim} {forged}/.rank0.hb.{pid} && ln -s {victim} {forged}/rank0.hb")
    with pytest.raises(InputError) as err:
        Monitor(_config(shared_base, port))
    message = str(err.value)
    assert str(forged) in message and f"owned by uid {NOBODY}" in message, message
    assert "\n" not in message, message
    assert victim.read_text() == "precious\n", victim.read_text()[:80]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="a second user needs root and setpriv")
def test_a_symlink_planted_by_another_user_is_refused(shared_base):
    port = free_port()
    path = job_state_dir("j", port, str(shared_base))
    _as_nobody(f"mkdir -m 0700 {shared_base}/theirs && ln -s {shared_base}/theirs {path}")
    with pytest.raises(InputError, match="is a symlink"):
        Monitor(_config(shared_base, port))


def test_own_directory_open_to_others_is_refused_and_a_new_one_is_private(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    with pytest.raises(InputError, match="mode 0777, expected 0700"):
        RankStateWriter(open_dir, 0)
    fresh = tmp_path / "fresh"
    writer = RankStateWriter(fresh, 0)
    try:
        assert fresh.stat().st_mode & 0o777 == 0o700, oct(fresh.stat().st_mode)
    finally:
        writer.close()


def test_new_files_never_follow_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        statedir.write_new(link, b"overwritten")
    assert target.read_text() == "keep"


def _idle(base: Path, port: int, job: str, seconds: float = 60.0) -> subprocess.Popen:
    env = {**os.environ, "FSDPMON_STATE_DIR": str(base), "FSDPMON_PORT": str(port),
           "FSDPMON_JOB_NAME": job, "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
           "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "monitor_idle.py"),
                             str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")


@pytest.mark.slow
def test_a_second_job_on_a_served_port_is_refused_and_sigterm_cleans_up(tmp_path):
    """Two jobs on one port: the second fails at start naming the first, whose rank stays
    served; SIGTERM then removes the first one's directory as a normal exit would."""
    port = free_port()
    first = _idle(tmp_path, port, "j")
    directory = job_state_dir("j", port, str(tmp_path))
    try:
        _ready(first)
        # same name: the same rank files; another name: the same port
        seconds = [_idle(tmp_path, port, job, seconds=5) for job in ("j", "other")]
        for second in seconds:
            _out, err = second.communicate(timeout=60)
            assert second.returncode == 2, (second.returncode, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and f"pid {first.pid}" in lines[0], err
        assert (directory / "rank0.hb").exists(), list(directory.iterdir())
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == -signal.SIGTERM, first.stderr.read()
        assert not directory.exists(), list(directory.iterdir())
    finally:
        first.kill()
        first.wait()


def test_leftovers_of_dead_jobs_are_removed_at_start(tmp_path):
    done = subprocess.Popen(["true"])
    done.wait()
    old = time.time() - 2 * statedir.STALE_AFTER_SECONDS
    made = {}
    for name, pid, mtime in (("dead", done.pid, old), ("live", os.getpid(), old),
                             ("young", done.pid, None)):
        directory = job_state_dir(name, 1, str(tmp_path))
        writer = RankStateWriter(directory, 0)
        writer.pid = pid
        writer.heartbeat(1.0, 1, 1, 1, 0, 1)
        writer._map.close()
        if mtime is not None:
            os.utime(directory, (mtime, mtime))
        made[name] = directory
    foreign = tmp_path / f"fsdpmon-{os.getuid() + 1}-x-1"  # not this user's name: left alone
    foreign.mkdir()
    os.utime(foreign, (old, old))
    port = free_port()
    mon = Monitor(_config(tmp_path, port))
    try:
        assert not made["dead"].exists()
        assert made["live"].exists() and made["young"].exists() and foreign.exists()
    finally:
        mon.close()
