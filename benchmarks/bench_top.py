"""Benchmark `fsdpmon top` on a large job: 256 nodes x 8 GPUs (2048 ranks, 256 training pods,
256 exporters) served by local HTTP servers on loopback.

Measures, in one run, and prints:
  - one full refresh (fetch all targets, parse, aggregate, render a 200x50 frame) of each
    table view, p50/p90, as top runs it and with each fast-path part left out (SETUPS: each C
    half, all of them, filing as read, the collector pause), every setup a `top` in a process
    of its own, refreshed in turn
  - each fast-path part's ratio (PARTS): the slowest view's p50 without it over with it, wall
    and CPU time, from those same refreshes
  - bytes fetched per refresh (asking with name[]) against the whole expositions
  - fetch-only time of the hand-written selector loop against urllib3's connection pool and
    aiohttp's asyncio client
  - resident memory of `top` after the refreshes
  - exposition parsing: fsdpmon's parser vs prometheus_client's text_string_to_metric_families
    on the same payloads, side by side (median of several runs), as a ratio; the rounds of
    parsing alternate with the rounds of refreshes, so that a machine whose speed drifts (a
    shared VM) slows both alike
  - the CPU the stand-in pods' servers spend per refresh (on this machine they share top's
    cores; real pods would not)
  - drawing each view's table: fsdpmon's CellTable against rich's Table holding the same rows
  - reading and filing the payloads: parsed into samples and then filed, against filed as read
    (bodies whose series are their target's last ones filed from their values alone)
  - the Prometheus source's refresh against a real Prometheus holding the same job
    (benchmarks/top_prometheus.py) and its queries per refresh
  - the last line: the slowest view's refresh over prometheus_client's parse of the full
    payloads, wall time and CPU time (on a machine shared with other work, wall time mostly
    measures the wait for a core)

The parts compared with kept libraries (fetching, parsing, filing, drawing) are in top_parts.py.
The pods are served by a few server processes (each one selector loop answering many paths,
like a node full of pods: tests/payload_server.py) so the client process measures only what
`top` itself does. Not a timed test: numbers depend on the machine; run
`python benchmarks/bench_top.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from fsdpmon.scrape import fastpath
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.fetch import with_names
from fsdpmon.scrape.fused import new_filing_parser
from fsdpmon.scrape.gcpause import top_owns_this_process
from fsdpmon.scrape.httpget import IN_FLIGHT
from fsdpmon.scrape.sources import targets
from fsdpmon.scrape.sources.cadence import SLOW_EVERY, SLOW_NAMES
from fsdpmon.scrape.sources.targets import TargetsSource
from fsdpmon.scrape.wanted import WANTED, new_parser
from fsdpmon.top.ui_state import ViewState
from fsdpmon.top.views import frame

# The synthetic job generator is test code (tests/synthetic_job.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import top_prometheus
from payload_server import PayloadServer
from synthetic_job import job_expositions
from top_parts import ParserRounds, draw_compare, filing_compare, http_compare


def _serve(nodes: int, gpus: int, ports: mp.Queue, stop: mp.Event) -> None:
    server = PayloadServer(job_expositions("llama2-7b", nodes, gpus))
    ports.put(server.port)
    stop.wait()
    server.close()


def start_servers(n: int, nodes: int, gpus: int) -> tuple[list[int], mp.Event, list]:
    ports: mp.Queue = mp.Queue()
    stop = mp.Event()
    procs = [mp.Process(target=_serve, args=(nodes, gpus, ports, stop), daemon=True)
             for _ in range(n)]
    for p in procs:
        p.start()
    return [ports.get(timeout=900) for _ in procs], stop, procs


VIEWS = (("ranks", "step_time"), ("gpus", "util"), ("processes", "cpu"))


def pod_urls(ports: list[int], paths: list[str]) -> list[str]:
    """The stand-in pods' URLs: each path on the server processes' ports in turn."""
    return [f"http://127.0.0.1:{ports[i % len(ports)]}{p}" for i, p in enumerate(paths)]


def timed_refresh(source: TargetsSource, console: Console,
                  view: str = "ranks", sort_key: str = "step_time") -> tuple[float, ...]:
    """(total, fetch+parse+aggregate, render, CPU time) seconds and the bytes received, one
    refresh."""
    source.showing(view)  # as the app tells it
    cpu = time.process_time()
    start = time.perf_counter()
    snap = source.fetch()
    fetched = time.perf_counter()
    console.file = io.StringIO()
    console.print(frame(snap, ViewState(view=view, sort_key=sort_key, descending=True),
                        console.size.height))
    done = time.perf_counter()
    if len(snap.ranks) == 0 or snap.targets_up != len(snap.targets):
        raise SystemExit(f"refresh incomplete: {snap.targets_up}/{len(snap.targets)} up")
    return (done - start, fetched - start, done - fetched, time.process_time() - cpu,
            source.bytes_received)


@dataclass(frozen=True)
class Setup:
    """One way to run top's refresh: as it runs, or with one fast-path part left out."""

    switch: str = ""  # FSDPMON_PURE_PYTHON in its process: the C halves left out
    fused: bool = True  # bodies filed as read (fused.py); else parsed, then filed
    collector_paused: bool = True  # gcpause around each refresh


# top as it runs, and each setup that leaves one part out (with what is built on it).
SETUPS = {
    "top": Setup(),
    "without C fill": Setup(switch="fill"),
    "without C fill_rows": Setup(switch="fill_rows"),
    "without C filing": Setup(switch="filing"),
    "without C rows": Setup(switch="rows"),
    "without any C half": Setup(switch="1"),
    "without filing as read": Setup(fused=False),
    "without the collector pause": Setup(collector_paused=False),
}
# Each part: (the setup with it, the setup without it), both in SETUPS.
PARTS = {
    "C fill: bodies checked against templates (_lines.c, layout.py)": ("top", "without C fill"),
    "C fill_rows: a template's values filed (_lines.c)": ("top", "without C fill_rows"),
    "C filing: file_result's loop and row_of (_filing.c)": ("top", "without C filing"),
    "C rows: frozen rows made (_rows.c)": ("top", "without C rows"),
    "every C half": ("top", "without any C half"),
    "filing as read (fused.py), and all built on it": ("top", "without filing as read"),
    "the collector paused around a refresh (gcpause.py)": ("top", "without the collector pause"),
}


def _parser(setup: Setup) -> Parser | None:
    return new_filing_parser(samples_of=SLOW_NAMES) if setup.fused else new_parser()


def _refresher(conn: Connection, urls: list[str], setup: Setup) -> None:
    """A process like `top`: one source, one console; refreshes a view when asked."""
    if fastpath.active() != fastpath.chosen(setup.switch):
        raise SystemExit(f"{fastpath.SWITCH}={setup.switch!r} did not reach the refresher")
    if setup.collector_paused:
        top_owns_this_process()  # as the live view does
    else:  # this process only: the refresh runs with the collector as Python leaves it
        targets.collector_paused = contextlib.nullcontext
    source = TargetsSource(urls, timeout_s=10.0, parser=_parser(setup))
    console = Console(width=200, height=50, color_system="truecolor", force_terminal=True)
    try:
        while (request := conn.recv()) is not None:
            if request == "state":
                snap = source.fetch()
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
                conn.send((_rss(os.getpid()), peak,
                           {k: len(getattr(snap, k)) for k in ("ranks", "gpus", "processes",
                                                               "targets")}))
            else:
                conn.send(timed_refresh(source, console, *request))
    finally:
        source.close()


class Refresher:
    """A `top` in its own process (a fresh interpreter: its heap holds its source alone, as a
    real one's does, not this benchmark's payloads or the other sources' caches)."""

    def __init__(self, urls: list[str], setup: Setup) -> None:
        ctx = mp.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_refresher, args=(theirs, urls, setup), daemon=True)
        before = os.environ.get(fastpath.SWITCH)
        os.environ[fastpath.SWITCH] = setup.switch  # read by the new interpreter as it starts
        try:
            self.process.start()
        finally:
            if before is None:
                del os.environ[fastpath.SWITCH]
            else:
                os.environ[fastpath.SWITCH] = before

    def ask(self, request: object) -> Any:
        self._conn.send(request)
        return self._conn.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self.process.join(timeout=10)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def _cpu(processes: list[psutil.Process]) -> float:
    """CPU seconds (user and system) the processes have spent so far."""
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def _rss(pid: int | None) -> int:
    """Resident bytes of process ``pid`` (none: 0)."""
    return psutil.Process(pid).memory_info().rss if pid is not None else 0


Runs = dict[str, list[tuple[float, ...]]]  # view → its refreshes' figures (timed_refresh's)


def _refresh_rounds(tops: dict[str, Refresher], servers: list[psutil.Process], refreshes: int,
                    rounds: int, between: Callable[[], None]) -> dict[str, Runs]:
    """Every setup refreshes each view in turn, so that load from other work hits them alike;
    ``between`` runs after each of ``rounds`` rounds."""
    runs: dict[str, Runs] = {k: {} for k in tops}
    for each in tops.values():
        for _ in range(2):
            each.ask(VIEWS[0])  # warm-up: imports, connections, caches
    per_round = -(-refreshes // rounds)
    order = list(tops)
    for _ in range(rounds):
        for view, key in VIEWS:
            for _ in range(per_round):
                order.append(order.pop(0))  # each setup takes each place in turn
                for name in order:
                    before = _cpu(servers)
                    runs[name].setdefault(view, []).append(
                        (*tops[name].ask((view, key)), _cpu(servers) - before))
        between()
    return runs


def _slowest(runs: Runs) -> tuple[float, float]:
    """The slowest view's p50: wall, CPU."""
    return (max(statistics.median(r[0] for r in rs) for rs in runs.values()),
            max(statistics.median(r[3] for r in rs) for rs in runs.values()))


def _print_setup(name: str, runs: Runs) -> None:
    print(f"  {name}:")
    for view, rs in runs.items():
        totals = [r[0] for r in rs]
        print(f"    {view:9s} p50 {statistics.median(totals) * 1e3:5.0f} ms, "
              f"p90 {_p(totals, 0.9) * 1e3:5.0f} ms; fetch+parse+aggregate p50 "
              f"{statistics.median(r[1] for r in rs) * 1e3:.0f} ms, render p50 "
              f"{statistics.median(r[2] for r in rs) * 1e3:.0f} ms, CPU p50 "
              f"{statistics.median(r[3] for r in rs) * 1e3:.0f} ms, "
              f"{statistics.mean(r[4] for r in rs) / 2**20:.1f} MiB per refresh")


def print_parts(slowest: dict[str, tuple[float, float]]) -> None:
    """Each fast-path part's ratio: the slowest view's p50 without it over with it."""
    print("each fast-path part: the slowest view's p50 without it / with it, same run "
          "(wall; CPU):")
    for part, (with_it, without) in PARTS.items():
        if with_it not in slowest or without not in slowest:
            continue  # a setup not run (--setups)
        (w1, c1), (w0, c0) = slowest[with_it], slowest[without]
        print(f"  {part:55s} {w0 * 1e3:4.0f} / {w1 * 1e3:4.0f} ms = {w0 / w1:.2f}x; CPU "
              f"{c0 * 1e3:4.0f} / {c1 * 1e3:4.0f} ms = {c0 / c1:.2f}x")


def bench_refresh(args: argparse.Namespace,
                  between: Callable[[], None]) -> dict[str, tuple[float, float]]:
    """Prints the refresh figures; returns each setup's slowest view p50 (wall, CPU), in
    seconds. ``between`` runs after each round of refreshes
    (``args.parse_repeat`` rounds)."""
    ports, stop, procs = start_servers(args.servers, args.nodes, args.gpus)
    servers = [psutil.Process(p.pid) for p in procs]
    payloads = job_expositions("llama2-7b", args.nodes, args.gpus)
    full_bytes = sum(len(b) for b in payloads.values())
    paths = sorted(payloads)
    urls = pod_urls(ports, paths)
    setups = {name: SETUPS[name] for name in ("top", *args.setups) if name in SETUPS}
    tops = {name: Refresher(urls, setup) for name, setup in setups.items()}
    try:
        runs = _refresh_rounds(tops, servers, args.refreshes, args.parse_repeat, between)
        rss, peak, counts = tops["top"].ask("state")
        ours, lib, aio = http_compare([with_names(u, WANTED) for u in urls], args.workers, 5)
    finally:
        for each in tops.values():
            each.close()
        stop.set()
        for p in procs:
            p.join(timeout=10)
    print(f"job: {args.nodes} nodes x {args.gpus} GPUs = {counts['ranks']} ranks, "
          f"{counts['gpus']} GPUs, {counts['processes']} processes, {counts['targets']} targets "
          f"({args.servers} server processes, {IN_FLIGHT} requests in flight)")
    print(f"full refresh (fetch+parse+aggregate+render 200x50), {args.refreshes} runs per view "
          f"and setup, each setup in a process of its own, refreshed in turn:")
    for name, setup_runs in runs.items():
        _print_setup(name, setup_runs)
    slowest = {name: _slowest(setup_runs) for name, setup_runs in runs.items()}
    served = [r[5] for rs in runs["top"].values() for r in rs]
    print(f"the stand-in pods' {args.servers} server processes, on the same cores: CPU p50 "
          f"{statistics.median(served) * 1e3:.0f} ms per refresh of top (real pods run "
          "elsewhere)")
    fetched = statistics.mean(r[4] for r in runs["top"]["ranks"])
    print(f"bytes per refresh (ranks view): {fetched / 2**20:.1f} MiB asking with name[] for "
          f"what top reads (process families and static facts every {SLOW_EVERY}th "
          f"refresh, the process families every refresh while the Processes view is open); "
          f"{full_bytes / 2**20:.1f} MiB before, the whole expositions: "
          f"{full_bytes / fetched:.1f}x less")
    print(f"HTTP, fetch only, all {len(urls)} targets with name[] (p50 of 5): selector loop "
          f"(httpget.get_all) {ours * 1e3:.0f} ms, urllib3 pool on {args.workers} threads "
          f"{lib * 1e3:.0f} ms, aiohttp on one asyncio loop {aio * 1e3:.0f} ms; the difference "
          f"is {(lib - ours) / slowest['top'][0] * 100:+.0f}% (urllib3) and "
          f"{(aio - ours) / slowest['top'][0] * 100:+.0f}% (aiohttp) of the slowest view's "
          "refresh")
    print(f"resident memory of top: {rss / 2**20:.0f} MiB now, peak {peak / 2**20:.0f} MiB")
    print_parts(slowest)
    return slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=IN_FLIGHT,
                        help="requests in flight in the HTTP comparison (top's: IN_FLIGHT)")
    parser.add_argument("--refreshes", type=int, default=15)
    parser.add_argument("--parse-repeat", type=int, default=5)
    parser.add_argument("--setups", nargs="*", default=list(SETUPS)[1:], metavar="SETUP",
                        help="the setups refreshed beside top's own, each in a process of its "
                             f"own (default: all: {'; '.join(list(SETUPS)[1:])})")
    args = parser.parse_args()
    print(f"machine: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    parsers = ParserRounds(args)
    slowest = bench_refresh(args, parsers.round)
    reference, reference_cpu = parsers.report()
    draw_compare(parsers.payloads, VIEWS)
    filing_compare(parsers.payloads)
    if shutil.which("promtool") and shutil.which("prometheus"):
        print(top_prometheus.report(args.nodes, args.gpus))
    else:
        print("Prometheus source: not measured (no prometheus/promtool; scripts/setup.sh --test)")
    wall, cpu = slowest["top"]
    met = "met" if reference / wall >= 50 else "not met"
    print(f"full refresh (slowest view, p50) / prometheus_client's parse of the full payloads "
          f"(same run): {wall * 1e3:.0f} / {reference * 1e3:.0f} ms = 1/{reference / wall:.1f} "
          f"(goal at most 1/50: {met}); CPU time (what load from other work hardly moves): "
          f"{cpu * 1e3:.0f} / {reference_cpu * 1e3:.0f} ms = 1/{reference_cpu / cpu:.1f}")

if __name__ == "__main__":
    main()
