"""Can password guessing be turned against the exporter? Valid scrapes with and without guessers.

Starts the real exporter (``fsdpmon exporter --simulate-gpus 8``) with basic auth (a cost-10
bcrypt hash, as ``htpasswd -nBC 10`` makes). Then, in one run: valid scrapes one after another,
in alternating blocks without guessers (unloaded) and while ``--guessers`` clients send wrong
passwords (a fresh one per request) as fast as they are answered (loaded); the guessers' process
is stopped and continued between blocks, so other load on the machine falls on both alike.
Prints the valid scrapes' p50/p99 of each phase, their ratio, the exporter's CPU (cores) and
what the guessers got. Goal (issue 18): p99 loaded <= 2 x unloaded, exporter <= 1 core.
Asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_exporter_auth.py [--seconds 20]``
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt

TICKS = os.sysconf("SC_CLK_TCK")
SETTLE = 1.5  # seconds after a switch: longer than a busy answer's delay plus a bcrypt check

# The guessers run in their own process, so their threads do not slow the measuring client
# (the GIL of one process); "q" on stdin stops them and prints {status: count} as JSON.
GUESSERS = r"""
import base64, collections, json, secrets, sys, threading, urllib.error, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
stop, got, lock = threading.Event(), collections.Counter(), threading.Lock()
def guess():
    while not stop.is_set():
        token = base64.b64encode(f"prometheus:{secrets.token_hex(8)}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": "Basic " + token})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
                code = resp.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        except OSError:
            code = -1
        with lock:
            got[code] += 1
threads = [threading.Thread(target=guess) for _ in range(n)]
for t in threads:
    t.start()
sys.stdin.readline()
stop.set()
for t in threads:
    t.join(35)
print(json.dumps(got))
"""


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(url: str, auth: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def valid_scrapes(url: str, auth: str, seconds: float) -> list[float]:
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        status = get(url, auth)
        latencies.append(time.perf_counter() - t0)
        if status != 200:
            raise SystemExit(f"a valid scrape was answered {status}: guessing locked it out")
        time.sleep(0.05)  # a scraper's cadence, compressed
    return latencies


def alternate(url: str, auth: str, guessers: subprocess.Popen, exporter_pid: int,
              seconds: float, block: float) -> tuple[list[float], list[float], float]:
    """Valid scrapes in alternating blocks, guessers stopped (SIGSTOP) then running (SIGCONT),
    so that load from elsewhere on the machine drifts into both phases alike. Scrapes in the
    SETTLE seconds after a switch are not counted: requests in flight (a bcrypt check, a busy
    answer's 1 s delay) belong to neither phase. Returns (unloaded, loaded, exporter cores while
    loaded)."""
    phases: dict[bool, list[float]] = {False: [], True: []}
    cpu_loaded = wall_loaded = 0.0
    loaded = True
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loaded = not loaded
        os.kill(guessers.pid, signal.SIGCONT if loaded else signal.SIGSTOP)
        valid_scrapes(url, auth, SETTLE)
        cpu0, t0 = cpu_seconds(exporter_pid), time.monotonic()
        phases[loaded] += valid_scrapes(url, auth, block)
        if loaded:
            cpu_loaded += cpu_seconds(exporter_pid) - cpu0
            wall_loaded += time.monotonic() - t0
    os.kill(guessers.pid, signal.SIGCONT)
    return phases[False], phases[True], cpu_loaded / max(wall_loaded, 1e-9)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0, help="per phase, over all its blocks")
    p.add_argument("--block", type=float, default=2.0, help="seconds per unloaded/loaded block")
    p.add_argument("--guessers", type=int, default=8)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-auth."))
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(rounds=10)).decode()
    web = work / "web.yaml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = subprocess.Popen(
        [sys.executable, "-m", "fsdpmon.cli", "exporter", "--simulate-gpus", "8", "--port",
         str(port), "--listen-address", "127.0.0.1", "--node-name", "bench",
         "--web-config-file", str(web)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    good = header("prometheus", "scrape-me")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if get(url, good) == 200:
                    break
            except OSError:
                time.sleep(0.2)
        guessers = subprocess.Popen([sys.executable, "-c", GUESSERS, url, str(args.guessers)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        quiet, loaded, cores = alternate(url, good, guessers, exporter.pid, 2 * args.seconds,
                                         args.block)
        got = {int(k): v for k, v in json.loads(guessers.communicate("q\n", timeout=60)[0]).items()}
    finally:
        exporter.terminate()
        exporter.wait(10)
    q50, q99, l50, l99 = (pct(quiet, 0.5), pct(quiet, 0.99), pct(loaded, 0.5),
                          pct(loaded, 0.99))
    print(f"valid scrapes unloaded: p50 {q50 * 1e3:.1f} ms, p99 {q99 * 1e3:.1f} ms "
          f"({len(quiet)} scrapes)")
    print(f"with {args.guessers} wrong-password clients: p50 {l50 * 1e3:.1f} ms, "
          f"p99 {l99 * 1e3:.1f} ms ({len(loaded)} scrapes); p99 ratio {l99 / q99:.2f} (goal <= 2)")
    print(f"exporter CPU while guessed at: {cores:.2f} cores (goal <= 1); guessers got "
          f"{dict(sorted(got.items()))} (401 denied, 429 busy, -1 connection error)")


if __name__ == "__main__":
    main()
