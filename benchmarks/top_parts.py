"""The parts of a `top` refresh against what kept libraries would do for them, for
bench_top.py: fetching (the selector loop against urllib3 and aiohttp), parsing (fsdpmon's parser
against prometheus_client's), filing (parsed then filed against filed as read) and drawing
(CellTable against rich's Table). Each prints what it measured; none is a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import urllib3
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from fsdpmon.families import restrict
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.filing import Acc, file_result
from fsdpmon.scrape.fused import new_filing_parser
from fsdpmon.scrape.httpget import get_all
from fsdpmon.scrape.sources.cadence import SLOW_NAMES, STATIC_NAMES
from fsdpmon.scrape.wanted import WANTED, new_parser
from fsdpmon.top.tables import select_rows, table_of
from fsdpmon.top.ui_state import ViewState

# The synthetic job generator is test code (tests/synthetic_job.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from synthetic_job import job_expositions


def http_compare(urls: list[str], workers: int, rounds: int) -> tuple[float, float, float]:
    """Fetch-only wall time of every URL (p50 over ``rounds``): (httpget.get_all's selector
    loop, urllib3's pooled connections on ``workers`` threads, aiohttp's client on one asyncio
    loop with ``workers`` requests at a time), the kept libraries' ways. Each request gets a
    connection of its own, as from pods that close theirs after each answer."""
    pool = urllib3.PoolManager(maxsize=workers, retries=False,
                               timeout=urllib3.Timeout(total=10.0))
    ours, lib, aio = [], [], []
    with ThreadPoolExecutor(workers) as threads:
        for _ in range(rounds):
            start = time.perf_counter()
            get_all(urls, 10.0, workers, lambda *a: None)
            ours.append(time.perf_counter() - start)
            start = time.perf_counter()
            list(threads.map(lambda u: pool.request("GET", u).data, urls))
            lib.append(time.perf_counter() - start)
            aio.append(asyncio.run(_aiohttp_fetch(urls, workers)))
    pool.clear()
    return statistics.median(ours), statistics.median(lib), statistics.median(aio)


async def _aiohttp_fetch(urls: list[str], workers: int) -> float:
    """Seconds aiohttp takes to fetch every URL, ``workers`` at a time (its session made
    outside the timing: a real `top` would keep one)."""
    connector = aiohttp.TCPConnector(limit=workers, force_close=True)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=10.0)) as session:

        async def body(url: str) -> bytes:
            async with session.get(url) as response:
                return await response.read()

        start = time.perf_counter()
        await asyncio.gather(*(body(u) for u in urls))
        return time.perf_counter() - start


def draw_compare(payloads: list[bytes], views: tuple[tuple[str, str], ...],
                 rounds: int = 20) -> None:
    """Drawing each view's table on a 200x50 screen: fsdpmon's CellTable against rich's Table
    holding the same rows (they draw the same characters: tests/test_celltable.py)."""
    parser = new_parser()
    snap = aggregate([ScrapeResult(Target(f"http://stand-in/{i}"), parser.parse(body))
                      for i, body in enumerate(payloads)], now=time.time(), source="bench")
    console = Console(width=200, height=50, color_system="truecolor", force_terminal=True)
    parts = []
    for view, key in views:
        state = ViewState(view=view, sort_key=key, descending=True)
        rows = getattr(snap, view)
        table = table_of(select_rows(rows, view, state), view, state, 45).renderables[0]
        times = {}
        for name, drawn in (("CellTable", table), ("rich Table", table.rich_table())):
            start = time.process_time()
            for _ in range(rounds):
                console.file = io.StringIO()
                console.print(drawn)
            times[name] = (time.process_time() - start) / rounds
        parts.append(f"{view} {times['CellTable'] * 1e3:.1f} vs {times['rich Table'] * 1e3:.1f}"
                     f" ms ({times['rich Table'] / times['CellTable']:.1f}x)")
    print("drawing a view's table (45 rows, 200 columns), CPU per frame: CellTable vs rich's "
          "Table: " + "; ".join(parts))


def filing_compare(payloads: list[bytes], rounds: int = 7) -> None:
    """Reading and filing what the Processes view asks for: parsing into Samples and then
    filing them, against filing the stored figures as they are read (fused.FilingParser), CPU
    time, best of ``rounds`` each, in turn."""
    bodies = [(Target(f"http://stand-in/{i}"), restrict(body, set(WANTED - STATIC_NAMES)))
              for i, body in enumerate(payloads)]
    plain, fused = new_parser(), new_filing_parser(SLOW_NAMES)

    def parse_then_file() -> None:
        acc = Acc()
        for target, body in bodies:
            file_result(acc, ScrapeResult(target, plain.parse(body)))

    def file_as_read() -> None:
        acc = Acc()
        for target, body in bodies:
            samples, filed = fused.parse_into(body, acc, target)
            file_result(acc, ScrapeResult(target, samples, filed=filed))

    best = {parse_then_file: float("inf"), file_as_read: float("inf")}
    for _ in range(rounds):
        for fn in best:
            start = time.process_time()
            fn()
            best[fn] = min(best[fn], time.process_time() - start)
    size = sum(len(body) for _, body in bodies) / 2**20
    print(f"reading and filing the Processes view's payloads ({size:.1f} MiB), CPU: parsed then "
          f"filed {best[parse_then_file] * 1e3:.0f} ms, filed as read "
          f"{best[file_as_read] * 1e3:.0f} ms ({best[file_as_read] / best[parse_then_file]:.2f})")


def _timed(fn, texts: list[str]) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    count = fn(texts)
    return time.perf_counter() - wall, time.process_time() - cpu, count


class ParserRounds:
    """fsdpmon's parser against prometheus_client's on the job's payloads, one round at a time
    (run between rounds of refreshes); ``report`` prints the figures and returns
    prometheus_client's median wall and CPU time."""

    def __init__(self, args: argparse.Namespace) -> None:
        # Each parser gets what it takes: prometheus_client text (decoded beforehand, untimed),
        # fsdpmon the bytes as they come off the socket.
        self.payloads = list(job_expositions("llama2-7b", args.nodes, args.gpus).values())
        self.texts = [b.decode() for b in self.payloads]
        self.rounds: list[list[tuple[float, float, int]]] = []

    def reference(self, ts: list[str]) -> int:
        return sum(len(f.samples) for t in ts for f in text_string_to_metric_families(t))

    def ours_all(self, _: list[str]) -> int:  # fresh parser: no cache across payloads
        return sum(len(Parser().parse(b)) for b in self.payloads)

    def ours_top(self, _: list[str]) -> int:
        return sum(len(new_parser().parse(b)) for b in self.payloads)

    def round(self) -> None:
        """The three parsers in turn, so that load from other processes hits them alike."""
        self.rounds.append([_timed(fn, self.texts)
                            for fn in (self.reference, self.ours_all, self.ours_top)])

    def report(self) -> tuple[float, float]:
        rounds = self.rounds
        ref_n, all_n, top_n = (rounds[0][i][2] for i in range(3))
        assert all_n == ref_n, (all_n, ref_n)

        def med(i: int, k: int) -> float:
            return statistics.median(r[i][k] for r in rounds)

        def ratio(i: int, k: int) -> float:
            return statistics.median(r[0][k] / r[i][k] for r in rounds)

        size = sum(len(t) for t in self.texts) / 2**20
        print(f"parsing {len(self.texts)} payloads, {size:.1f} MiB, {ref_n} samples (median of "
              f"{len(rounds)} rounds, between the rounds of refreshes; wall ms / CPU ms):")
        print(f"  prometheus_client text_string_to_metric_families: {med(0, 0) * 1e3:6.0f} / "
              f"{med(0, 1) * 1e3:6.0f}")
        print(f"  fsdpmon expfmt, every sample:                      {med(1, 0) * 1e3:6.0f} / "
              f"{med(1, 1) * 1e3:6.0f}  -> {ratio(1, 0):.1f}x faster (CPU {ratio(1, 1):.1f}x)")
        print(f"  fsdpmon expfmt, the {len(WANTED)} names top reads ({top_n} samples): "
              f"{med(2, 0) * 1e3:4.0f} / {med(2, 1) * 1e3:4.0f}  -> {ratio(2, 0):.1f}x faster "
              f"(CPU {ratio(2, 1):.1f}x)")
        return med(0, 0), med(0, 1)
