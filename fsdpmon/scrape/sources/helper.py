"""A second process that scrapes, parses and files a share of a large job's plain-HTTP targets,
so that a refresh uses two cores: fetching, parsing and filing are plain Python on one thread
(the GIL), about two thirds of a refresh for 512 targets, and each target's part is independent.

The helper keeps its share of the targets, its own parser (and label caches) and its own carry of
the slow families (cadence) for the life of the source; each refresh it is told the names to ask
for, scrapes and files its targets while the main process does the rest, and sends back its
accumulators (rows as dicts, ~600 kB pickled for 256 targets), which the main process merges
before building the rows. They come in two parts: the first once ``EARLY_PART`` of its targets
are filed (sent by a thread, so that the helper goes on while the main process is still busy
with its own targets), the rest at the end; the main process then unpickles most of the share
while it would otherwise wait for the helper's last targets, and only the last part after.
A helper that dies or does not answer in time costs its targets (reported down with the
reason) for that refresh only; the next refresh starts a new one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from fsdpmon.job.snapshot import TargetStatus
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.fetch import scrape_urls
from fsdpmon.scrape.filing import Acc, ScrapeResult, Target, file_result
from fsdpmon.scrape.fused import new_filing_parser
from fsdpmon.scrape.gcpause import collector_paused, top_owns_this_process
from fsdpmon.scrape.sources.cadence import SLOW_NAMES, Cadence

# Fewer plain-HTTP targets than this are all scraped in the main process: a helper's start
# (~1 s, once) and the pickled rows it sends back (~1/10 of what filing them costs) only pay for
# themselves on a large job.
SPLIT_MIN_TARGETS = 64
# The share of its targets the helper files before it sends what it has (the first part of its
# share): the main process, done with its own targets a little before the helper, unpickles that
# part while the rest is filed.
EARLY_PART = 0.75


@dataclass(frozen=True)
class Share:
    """One part of a refresh of the helper's targets, numbered as in its own list; the figures
    of the whole refresh are in its last part."""

    acc: Acc  # memos emptied: ids mean nothing in another process
    statuses: dict[int, TargetStatus]
    down: dict[int, ScrapeResult]
    received: int = 0  # body bytes
    lacking: bool = False  # a target lacked its static facts: the next refresh asks for all
    cpu_s: float = 0.0  # the helper's CPU time for it
    last: bool = True  # more parts of this refresh follow when False


def main() -> None:
    """The helper process (``python -m fsdpmon.scrape.sources.helper FD``): serves refreshes on the
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
            early = _Early(conn)
            try:
                share: Share | str = _refresh(targets, parser, cadence, timeout_s, limit,
                                              request, early.send)
            except Exception as exc:  # a bug here must not hang the main process
                share = f"{type(exc).__name__}: {exc}"
            if not early.sent():
                return
            try:
                conn.send(share)
            except (EOFError, OSError):
                return
            del share


class _Early:
    """Sends a refresh's first part from a thread: while the main process is still busy with
    its own targets it does not read, and the part is larger than the socket's buffer."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._thread: threading.Thread | None = None
        self._failed = False

    def send(self, share: Share) -> None:
        data = pickle.dumps(share, pickle.HIGHEST_PROTOCOL)
        self._thread = threading.Thread(target=self._send, args=(data,), daemon=True)
        self._thread.start()

    def _send(self, data: bytes) -> None:
        try:
            self._conn.send_bytes(data)
        except (EOFError, OSError):  # the main process is gone
            self._failed = True

    def sent(self) -> bool:
        """Waits for the first part to be sent; False when it could not be."""
        if self._thread is not None:
            self._thread.join()
        return not self._failed


def _refresh(targets: list[Target], parser: Parser, cadence: Cadence, timeout_s: float,
             limit: int, names: frozenset[str], send_early: Callable[[Share], None]) -> Share:
    """Scrapes and files the helper's targets; ``send_early`` gets the first part of the
    share, the last part is returned."""
    cpu = time.process_time()
    part = Share(Acc(), {}, {}, last=False)
    early_at = int(len(targets) * EARLY_PART) if len(targets) > 1 else -1
    cadence.begin(names)

    def add(i: int, result: ScrapeResult) -> None:
        nonlocal part, early_at
        result = cadence.complete(result)
        if result.samples is None:
            part.down[i] = result
        else:
            part.statuses[i] = file_result(part.acc, result)
        if len(part.statuses) + len(part.down) == early_at:
            part.acc.drop_memos()
            send_early(part)
            part, early_at = Share(Acc(), {}, {}, last=False), -1  # the rest: see filing.merge

    received = scrape_urls(targets, parser, timeout_s, limit, None, add, names,
                           lambda: part.acc)
    part.acc.drop_memos()
    return Share(part.acc, part.statuses, part.down, received, cadence.lacking,
                 time.process_time() - cpu)


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
    from fsdpmon.scrape.sources import helper

    helper.main()
