"""Benchmark the per-node exporter: scrape latency, sampler CPU, memory, and the exposition floor.

Runs the real `fsdpmon exporter --simulate-gpus 8 --interval 1` as its own process, with 200 real
(sleeping) processes marked as training processes (FSDPMON_JOB_NAME in their environment), so the
exporter serves 8 GPUs and 200 processes, the simulated GPUs shared out among them. Measures:

- scrape latency p50/p99 over HTTP (median over rounds); target p50 <= 5 ms;
- the exporter's CPU share of one core while idle between scrapes at a 1 s interval (this is
  the sampler's cost; median over windows); target <= 2%;
- the exporter's resident memory; target <= 80 MB;
- the floor: the same series, pre-built, served by prometheus_client's own start_http_server in
  a separate process and scraped the same way; the ratio of our p50 to that p50.

Usage: .venv/bin/python benchmarks/bench_exporter.py [--rounds 5] [--scrapes 200] [--windows 3]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil

from fsdpmon import catalog

PROCESSES = 200
GPUS = 8
PROCESS_SERIES = catalog.PROCESS_INFO.name.encode() + b"{"  # one per covered process
SERVING = re.compile(r"serving https?://[\d.]+:(\d+)/metrics")

FLOOR_SERVER = """
import sys, time
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry
families = list(text_string_to_metric_families(open(sys.argv[1]).read()))
class Static(Collector):
    def collect(self):
        return iter(families)
registry = CollectorRegistry()
registry.register(Static())
server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
print(server.server_address[1], flush=True)
time.sleep(3600)
"""


@contextmanager
def sleepers(count: int) -> Iterator[list[subprocess.Popen]]:
    env = {**os.environ, "FSDPMON_JOB_NAME": "bench"}
    procs = [subprocess.Popen(["sleep", "3600"], env=env, start_new_session=True)
             for _ in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(10)


@contextmanager
def process(args: list[str], ready: re.Pattern[str]) -> Iterator[tuple[subprocess.Popen, int]]:
    """Start a server process and yield it with the port its first matching output line names."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            match = ready.search(line)
            if match:
                yield proc, int(match.group(1))
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"{args[0]} did not start")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def scrape(port: int, zipped: bool = False) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if zipped else {})
    body = conn.getresponse().read()
    conn.close()
    return time.perf_counter() - t0, body


def one_round(port: int, scrapes: int, zipped: bool) -> tuple[float, float]:
    times = sorted(scrape(port, zipped)[0] for _ in range(scrapes))
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def interleaved(ports: dict[str, int], rounds: int, scrapes: int,
                zipped: bool) -> dict[str, tuple[float, float]]:
    """Median over rounds of each round's (p50, p99) per server, rounds alternating between
    servers so that load from elsewhere on the machine hits both alike."""
    per: dict[str, list[tuple[float, float]]] = {name: [] for name in ports}
    for _ in range(rounds):
        for name, port in ports.items():
            per[name].append(one_round(port, scrapes, zipped))
    return {name: (statistics.median(r[0] for r in results),
                   statistics.median(r[1] for r in results))
            for name, results in per.items()}


def cpu_share(pid: int, windows: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    shares = []
    for _ in range(windows):
        before, t0 = proc.cpu_times(), time.monotonic()
        time.sleep(seconds)
        after, t1 = proc.cpu_times(), time.monotonic()
        used = (after.user + after.system) - (before.user + before.system)
        shares.append(used / (t1 - t0))
    return statistics.median(shares)


def wait_for_processes(port: int, want: int, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = scrape(port)[1]
        if body.count(PROCESS_SERIES) >= want:
            return body
        time.sleep(0.5)
    raise RuntimeError(f"exporter never covered {want} processes")


def cpu_share_while_scraped(pid: int, port: int, windows: int, seconds: float) -> float:
    """CPU share with one gzip scrape a second (as a Prometheus at 1 s would ask): sampling plus
    one render per sample."""
    stop = threading.Event()

    def scraper() -> None:
        while not stop.wait(1.0):
            scrape(port, zipped=True)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        return cpu_share(pid, windows, seconds)
    finally:
        stop.set()
        thread.join(5)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    exporter_cmd = [sys.executable, "-m", "fsdpmon.cli", "exporter", "--simulate-gpus", str(GPUS),
                    "--interval", "1", "--port", "0", "--listen-address", "127.0.0.1",
                    "--node-name", "bench"]
    out: dict[str, Any] = {}
    with sleepers(PROCESSES), process(exporter_cmd, SERVING) as (exporter, port):
        body = wait_for_processes(port, PROCESSES)
        out["body"] = body
        out["share"] = cpu_share(exporter.pid, args.windows, args.window_seconds)
        out["share_scraped"] = cpu_share_while_scraped(exporter.pid, port, args.windows,
                                                       args.window_seconds)
        with tempfile.NamedTemporaryFile("wb", suffix=".prom", delete=False) as f:
            f.write(body)
        try:
            floor_cmd = [sys.executable, "-c", FLOOR_SERVER, f.name]
            with process(floor_cmd, re.compile(r"^(\d+)$")) as (_, floor_port):
                ports = {"fsdpmon": port, "floor": floor_port}
                out["plain"] = interleaved(ports, args.rounds, args.scrapes, zipped=False)
                out["gzip"] = interleaved(ports, args.rounds, args.scrapes, zipped=True)
        finally:
            os.unlink(f.name)
        out["rss"] = psutil.Process(exporter.pid).memory_info().rss
    return out


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    body, plain, zipped = r["body"], r["plain"], r["gzip"]
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"machine: {platform.machine()}, {psutil.cpu_count()} CPUs, no GPU "
          f"(simulated GPUs); python {platform.python_version()}")
    print(f"setup: {GPUS} simulated GPUs, {body.count(PROCESS_SERIES)} processes "
          f"covered, {series} series, {len(body) / 1024:.0f} KiB per scrape, interval 1 s")
    print(f"{'measure':<52}{'value':>10}{'target':>10}")
    rows = [
        ("scrape latency p50 (ms)", plain["fsdpmon"][0] * 1e3, "<= 5"),
        ("scrape latency p99 (ms)", plain["fsdpmon"][1] * 1e3, ""),
        ("scrape latency p50, gzip as Prometheus asks (ms)", zipped["fsdpmon"][0] * 1e3, ""),
        ("scrape latency p99, gzip (ms)", zipped["fsdpmon"][1] * 1e3, ""),
        ("sampler CPU share of one core, 1 s interval (%)", r["share"] * 100, "<= 2"),
        ("  same, plus one gzip scrape per second (%)", r["share_scraped"] * 100, ""),
        ("exporter resident memory (MB)", r["rss"] / 1e6, "<= 80"),
        ("floor: prometheus_client, same series, p50 (ms)", plain["floor"][0] * 1e3, ""),
        ("floor: prometheus_client, same series, p99 (ms)", plain["floor"][1] * 1e3, ""),
        ("floor p50, gzip (ms)", zipped["floor"][0] * 1e3, ""),
        ("floor p99, gzip (ms)", zipped["floor"][1] * 1e3, ""),
        ("ratio scrape p50 / floor p50", plain["fsdpmon"][0] / plain["floor"][0], ""),
        ("ratio scrape p50 / floor p50, gzip", zipped["fsdpmon"][0] / zipped["floor"][0], ""),
    ]
    for name, value, target in rows:
        print(f"{name:<52}{value:>10.2f}{target:>10}")
    print(f"(median of {args.rounds} rounds x {args.scrapes} scrapes, rounds alternating "
          f"between the two servers; CPU: median of {args.windows} windows x "
          f"{args.window_seconds:.0f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-seconds", type=float, default=10.0)
    args = parser.parse_args()
    report(measure(args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
