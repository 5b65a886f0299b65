"""The pod's endpoint is a process of its own (fsdpmon.monitor.podserver), started by a rank.

- The lock says who serves: a held lock is seen from any descriptor; a second server leaves.
- TLS and basic auth come from the web-config file, read by the server itself; a server that
  dies is started again by the rank.
- Four local ranks (the Monitor in plain processes): rank 0, which started the server, is
  stopped with SIGSTOP and rank 2 hangs in a C call holding the GIL; `fsdpmon diagnose`'s engine,
  fed from the endpoint, names both `rank_unresponsive` within UNRESPONSIVE_BOUND_S while ranks
  1 and 3 stay served and responsive. Then every rank is SIGKILLed: the server ends by itself,
  the port is free, and the directory keeps only the killed ranks' exit records (for a restart
  to read), nothing else.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml
from diagnose_job import named
from support import free_port

from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.monitor import podserver
from fsdpmon.monitor.heartbeat import pid_alive
from fsdpmon.monitor.state import job_state_dir
from fsdpmon.scrape.sources.targets import TargetsSource

# quiet: its processes mostly wait (34.0 s, 14.9 s alone, /usr/bin/time, 2-core VM)
pytestmark = pytest.mark.quiet

REPO = Path(__file__).resolve().parents[1]
UNRESPONSIVE_BOUND_S = 20.0  # from the fault to the first refresh naming it (issue 40)


def test_a_held_lock_is_seen_and_a_second_server_leaves(tmp_path):
    assert not podserver.running(tmp_path)  # no lock file at all
    fd = podserver.take_lock(tmp_path)
    assert fd is not None
    try:
        assert podserver.running(tmp_path)
        assert (tmp_path / podserver.LOCK_NAME).read_text() == str(os.getpid())
        assert podserver.take_lock(tmp_path, wait_s=0.1) is None
    finally:
        os.close(fd)
    assert not podserver.running(tmp_path)  # released with the descriptor
    assert podserver.server_pid(tmp_path) is None


def _idle_rank(state: Path, port: int, rank: int, world: int, job: str,
               **extra: str) -> subprocess.Popen:
    env = {**os.environ, "FSDPMON_STATE_DIR": str(state), "FSDPMON_PORT": str(port),
           "FSDPMON_JOB_NAME": job, "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
           "FSDPMON_SERVER_RETRY_SECONDS": "0.5", "FSDPMON_LOG_INTERVAL": "5",
           "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
           "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", **extra}
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "monitor_idle.py"), "600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def _get(url: str, header: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": header} if header else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return 0, b""


def _until(what: str, check, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds:.0f}s")


@pytest.mark.slow
def test_the_server_takes_basic_auth_from_the_web_config(tmp_path):
    config = tmp_path / "web.yml"
    config.write_text(yaml.safe_dump({"basic_auth_users": {
        "prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()}}))
    port = free_port()
    rank = _idle_rank(tmp_path / "state", port, 0, 1, "auth",
                      FSDPMON_WEB_CONFIG_FILE=str(config))
    url = f"http://127.0.0.1:{port}/metrics"
    good, bad = ("Basic " + base64.b64encode(b"prometheus:" + pw).decode()
                 for pw in (b"s3cret", b"wrong"))
    try:
        t0 = time.monotonic()
        assert rank.stdout.readline().strip() == "ready"
        print(f"ready after {time.monotonic() - t0:.1f}s")
        _until("served with the password", lambda: (
            (s := _get(url, good))[0] == 200 and b"fsdpmon_train_step" in s[1] and s))
        assert _get(url)[0] == 401 and _get(url, bad)[0] == 401
        directory = job_state_dir("auth", port, str(tmp_path / "state"))
        pid = podserver.server_pid(directory)
        assert pid is not None and pid != rank.pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"s3cret" not in b" ".join(cmdline) and str(config).encode() in cmdline
        # A server that dies (kill -9, the OOM killer) is started again by the rank.
        os.kill(pid, signal.SIGKILL)
        pid = _until("another server", lambda: (p := podserver.server_pid(directory)) != pid
                     and p)
        _until("served again", lambda: _get(url, good)[0] == 200)
    finally:
        t0 = time.monotonic()
        rank.send_signal(signal.SIGTERM)
        rank.wait(timeout=30)
        print(f"ended after {time.monotonic() - t0:.1f}s")
    # The last rank out ends the server and the directory goes with them.
    assert not directory.exists(), list(directory.iterdir())
    _until("the server to end", lambda: not pid_alive(pid), 10)


@pytest.mark.slow
def test_stopped_and_gil_holding_ranks_are_named_while_the_pod_stays_served(tmp_path):
    port, world, state = free_port(), 4, tmp_path / "state"
    trigger = tmp_path / "gil"
    ranks = [_idle_rank(state, port, r, world, "pod",
                        **({"MONITOR_IDLE_GIL_TRIGGER": str(trigger)} if r == 2 else {}))
             for r in range(world)]
    directory = job_state_dir("pod", port, str(state))
    url = f"127.0.0.1:{port}"
    source = TargetsSource([url], timeout_s=2.0)
    try:
        for proc in ranks:
            assert proc.stdout.readline().strip() == "ready"
        diagnoser = Diagnoser(source, 2.0)
        _until("four ranks served", lambda: len(source.fetch().ranks) == world)
        server = podserver.server_pid(directory)
        assert server is not None and server not in {p.pid for p in ranks}
        os.kill(ranks[0].pid, signal.SIGSTOP)  # the rank that started the server
        trigger.write_text("")  # rank 2 hangs in C holding the GIL
        fault_at = time.monotonic()
        while True:
            snap = source.fetch()
            verdict = diagnoser.update(snap)
            took = time.monotonic() - fault_at
            if all(named(verdict.findings, "rank_unresponsive", r) for r in (0, 2)):
                break
            assert took <= UNRESPONSIVE_BOUND_S + 10, (
                f"not named within {took:.0f}s: {verdict.findings}; ranks {snap.ranks}")
            time.sleep(0.5)
        assert took <= UNRESPONSIVE_BOUND_S, f"named {took - UNRESPONSIVE_BOUND_S:.1f}s late"
        rows = {r.rank: r for r in snap.ranks}
        assert sorted(rows) == [0, 1, 2, 3] and not any(r.down for r in rows.values()), rows
        assert [r for r in (1, 3) if rows[r].unresponsive] == [], rows
        assert {f.rank for f in verdict.findings} == {0, 2}, verdict.findings
        status, body = _get(f"http://{url}/stacks")
        assert status == 200 and len(json.loads(body)["ranks"]) == world
    finally:
        source.close()
        for proc in ranks:
            proc.kill()
            proc.wait()
    # Every rank killed: the server ends by itself, the port is free, nothing else is left but
    # the killed ranks' exit records (a restarted rank reads its own to say it was killed).
    _until("the server to end", lambda: not pid_alive(server), 10)
    with socket.socket() as sock:  # as a new server would bind it: nobody listens there now
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    left = sorted(p.name for p in directory.iterdir())
    assert left == [f"rank{r}.exit" for r in range(world)], left
