"""A real 2-rank job of the bundled trainer, stopped the ways an orchestrator stops one, and
what it leaves (issue 52). tests/test_shutdown.py runs a few stops, benchmarks/bench_shutdown.py
all of them, many rounds.

Each round starts a job (torchrun, CPU ranks, its state under /dev/shm as in production) on a
port the previous round used, so that its first scrape, answered, shows a new job is served
there; stops it; then, within ``EXIT_BOUND_S`` of the stop, expects: no process of the job (the
pod's server included, which is in a session of its own), the port free, and nothing of the
job under /dev/shm but the exit records of ranks killed (for a restart to read).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from fsdpmon import catalog
from fsdpmon.monitor import podserver
from fsdpmon.monitor.state import job_state_dir

REPO = Path(__file__).resolve().parents[1]
EXIT_BOUND_S = 10.0  # from the stop to nothing left (the bound)
START_BOUND_S = 120.0  # a loaded 2-core machine starts two torch ranks in well under this
TRAINER = "fsdpmon.trainer.train"
STOPS = ("term_twice", "term_then_int", "term_at_startup", "kill_rank_then_term",
         "kill_server_then_term", "normal_end")
SHORT_RUN_STEPS = 10


@dataclass
class Round:
    stop: str
    seconds_to_exit: float = 0.0  # from the stop (normal end: from the job's own exit)
    leftovers: list[str] = field(default_factory=list)


def _steps(port: int) -> dict[int, float]:
    """rank -> step the job's endpoint serves ({} when nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    return {int(s.labels["rank"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == catalog.TRAIN_STEP.name}


def _start(port: int, job: str, steps: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONUNBUFFERED": "1", "FSDPMON_SERVER_RETRY_SECONDS": "1"}
    for name in ("FSDPMON_STATE_DIR", "FSDPMON_FAULT", "FSDPMON_PORT"):
        env.pop(name, None)
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "--max-restarts", "0", "-m", TRAINER, "--model", "tiny", "--max-steps", str(steps),
            "--batch-size", "2", "--seq-len", "32", "--log-every", "5", "--metrics-port",
            str(port), "--job-name", job]
    with open(log, "w") as out:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _family(proc: subprocess.Popen, directory: Path) -> dict[int, psutil.Process]:
    """The job's processes now: torchrun, its descendants, and the pod's server."""
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(proc.pid)
        for p in (root, *root.children(recursive=True)):
            found[p.pid] = p
    pid = podserver.server_pid(directory)
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid)
    return found


def _until(check, seconds: float, interval: float = 0.1):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    return None


def _workers(family: dict[int, psutil.Process]) -> dict[int, int]:
    out = {}
    for p in family.values():
        with contextlib.suppress(psutil.Error):
            rank = p.environ().get("RANK")
            if rank is not None and TRAINER in " ".join(p.cmdline()):
                out[int(rank)] = p.pid
    return out


def _scrape_while(port: int, action) -> None:
    """``action`` while a scrape of the endpoint is in flight (a slow reader: a raw socket
    that sends the request and reads the answer slowly)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        action()
        with contextlib.suppress(OSError):
            sock.recv(10)


def _stop(stop: str, proc: subprocess.Popen, port: int, directory: Path,
          family: dict[int, psutil.Process]) -> None:
    group = proc.pid
    if stop in ("term_twice", "term_at_startup"):
        os.killpg(group, signal.SIGTERM)
        if stop == "term_twice":
            os.killpg(group, signal.SIGTERM)  # within 10 ms: the next statement
    elif stop == "term_then_int":
        os.killpg(group, signal.SIGTERM)
        time.sleep(0.05)
        os.killpg(group, signal.SIGINT)
    elif stop == "kill_rank_then_term":
        os.kill(_workers(family)[1], signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
    elif stop == "kill_server_then_term":
        server = podserver.server_pid(directory)
        assert server is not None, "no server to kill"
        _scrape_while(port, lambda: os.kill(server, signal.SIGKILL))
        os.killpg(group, signal.SIGTERM)


def _left(directory: Path, family: dict[int, psutil.Process], port: int,
          killed_ranks: bool) -> list[str]:
    """What is left of the job: processes, the port, files (exit records of killed ranks
    excepted)."""
    left = []
    for p in family.values():
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"process {p.pid} {' '.join(p.cmdline()[:6])}")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            left.append(f"port {port}: {exc}")
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            if not (killed_ranks and re.fullmatch(r"rank\d+\.exit", path.name)):
                left.append(f"file {path}")
    return left


def one_round(stop: str, port: int, work: Path, job: str | None = None) -> Round:
    """Start a job on ``port``, stop it the ``stop`` way, and say what was left."""
    job = job or f"shutdown-{uuid.uuid4().hex[:8]}"
    directory = job_state_dir(job, port)
    steps = SHORT_RUN_STEPS if stop == "normal_end" else 10**6
    proc = _start(port, job, steps, work / f"{stop}.log")
    family: dict[int, psutil.Process] = {}
    try:
        if stop == "term_at_startup":  # the ranks have begun (their directory), no step yet
            assert _until(directory.exists, START_BOUND_S, 0.02), log_tail(work, stop)
        elif stop != "normal_end":
            assert _until(lambda: len([s for s in _steps(port).values() if s >= 1]) == 2,
                          START_BOUND_S), f"never served on port {port}:\n{log_tail(work, stop)}"
        family.update(_family(proc, directory))
        begun = time.monotonic()
        if stop == "normal_end":
            proc.wait(timeout=START_BOUND_S)
            begun = time.monotonic()
        else:
            _stop(stop, proc, port, directory, family)
        family.update(_family(proc, directory))
        killed = stop in ("kill_rank_then_term", "kill_server_then_term")
        clear = _until(lambda: not _left(directory, family, port, killed), EXIT_BOUND_S, 0.05)
        result = Round(stop, time.monotonic() - begun)
        if not clear:
            result.leftovers = _left(directory, family, port, killed)
        return result
    finally:
        _kill(proc, family)


def _kill(proc: subprocess.Popen, family: dict[int, psutil.Process]) -> None:
    """What a failed round left, gone before the next one (the test reports it first)."""
    for p in family.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def log_tail(work: Path, stop: str) -> str:
    with contextlib.suppress(OSError):
        return (work / f"{stop}.log").read_text()[-3000:]
    return ""
