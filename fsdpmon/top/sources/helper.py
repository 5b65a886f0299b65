"""A second process that scrapes, parses and files a share of a large job's plain-HTTP targets,
so that a refresh uses two cores: fetching, parsing and filing are plain Python on one thread
(the GIL), about two thirds of a refresh for 512 targets, and each target's part is independent.

The helper keeps its share of the targets, its own parser (and label caches) and its own carry of
the slow families (cadence) for the life of the source; each refresh it is told the names to ask
for, scrapes and files its targets while the main process does the rest, and sends back its
accumulators (rows as dicts, a few MB pickled), which the main process merges before building
the rows. A helper that dies or does not answer in time costs its targets (reported down with
the reason) for that refresh only; the next refresh starts a new one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from fsdpmon.top.expfmt import Parser
from fsdpmon.top.filing import Acc, ScrapeResult, Target, file_result
from fsdpmon.top.fused import new_filing_parser
from fsdpmon.top.snapshot import TargetStatus
from fsdpmon.top.sources.cadence import SLOW_NAMES, Cadence
from fsdpmon.top.sources.gcpause import collector_paused, top_owns_this_process

# Fewer plain-HTTP targets than this are all scraped in the main process: a helper's start
# (~1 s, once) and the pickled rows it sends back (~1/10 of what filing them costs) only pay for
# themselves on a large job.
SPLIT_MIN_TARGETS = 64


@dataclass(frozen=True)
class Share:
    """One refresh of the helper's targets, numbered as in its own list."""

    acc: Acc  # memos emptied: ids mean nothing in another process
    statuses: dict[int, TargetStatus]
    down: dict[int, ScrapeResult]
    received: int  # body bytes
    lacking: bool  # a target lacked its static facts: the next refresh asks for all
    cpu_s: float  # the helper's CPU time for it


def main() -> None:
    """The helper process (``python -m fsdpmon.top.sources.helper FD``): serves refreshes on the
    connection at file descriptor FD until told to stop or the main process goes."""
    top_owns_this_process()
    conn = Connection(int(sys.argv[1]))
    try:
        urls, timeout_s, limit = conn.recv()
    except (EOFError, OSError):
        return
    targets = [Target(u) for u in urls]
    parser, cadence = new_filing_parser(samples_of=SLOW_NAMES), Cadence()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the main process is gone
            return
        if request is None:
            return
        with collector_paused():
            try:
                share: Share | str = _refresh(targets, parser, cadence, timeout_s, limit,
                                              request)
            except Exception as exc:  # a bug here must not hang the main process
                share = f"{type(exc).__name__}: {exc}"
            try:
                conn.send(share)
            except (EOFError, OSError):
                return
            del share


def _refresh(targets: list[Target], parser: Parser, cadence: Cadence, timeout_s: float,
             limit: int, names: frozenset[str]) -> Share:
    from fsdpmon.top.sources.targets import scrape_urls

    cpu = time.process_time()
    acc = Acc()
    statuses: dict[int, TargetStatus] = {}
    down: dict[int, ScrapeResult] = {}
    cadence.begin(names)

    def add(i: int, result: ScrapeResult) -> None:
        result = cadence.complete(result)
        if result.samples is None:
            down[i] = result
        else:
            statuses[i] = file_result(acc, result)

    received = scrape_urls(targets, parser, timeout_s, limit, None, add, names, acc)
    acc.drop_memos()
    return Share(acc, statuses, down, received, cadence.lacking, time.process_time() - cpu)


class Helper:
    """The main process's handle on one helper: ``ask`` at the start of a refresh, ``answer``
    once its own share is filed."""

    def __init__(self, urls: Sequence[str], timeout_s: float, limit: int) -> None:
        self.urls = list(urls)
        self.timeout_s, self.limit = timeout_s, limit
        # A fresh interpreter, not multiprocessing's spawn: that re-runs the caller's main
        # module, which a script without a ``__main__`` guard cannot survive.
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).resolve().parents[3]), *filter(None, [env.get("PYTHONPATH")])])
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._conn = Connection(ours.detach())
        self._conn.send((self.urls, timeout_s, limit))

    def ask(self, names: frozenset[str]) -> None:
        self._conn.send(names)

    def answer(self) -> Share | str:
        """The helper's share, or why there is none (then the helper is closed)."""
        # Its targets time out by timeout_s each, at most ``limit`` at a time; the first
        # refresh also waits for the process to start and import.
        wait_s = self.timeout_s * -(-len(self.urls) // self.limit) + 30.0
        try:
            if self._conn.poll(wait_s):
                share = self._conn.recv()
                if isinstance(share, Share):
                    return share
                reason = str(share)
            else:
                reason = f"no answer within {wait_s:.0f} s"
        except (EOFError, OSError) as exc:
            reason = f"it exited ({exc or type(exc).__name__})"
        self.close()
        return f"top's helper process failed: {reason}"

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(None)
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=2.0)
        self._conn.close()


if __name__ == "__main__":
    # Run as a module: the names above belong to __main__, not to the module the main process
    # unpickles Share from; take them from the imported module instead.
    from fsdpmon.top.sources import helper

    helper.main()
