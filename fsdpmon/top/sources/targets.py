"""Plain scrape targets (`--targets URL,...`): concurrent HTTP scrapes, bounded and timed out.

Every target is fetched with a per-target deadline, at most ``httpget.IN_FLIGHT`` at a time, by
one selector loop on the refreshing thread (`httpget.get_all`); each body is parsed and
aggregated on that thread as soon as it arrives (only the series `top` reads). HTTPS targets go
through blocking GETs on a thread pool (``max_workers`` threads) meanwhile. A target that
refuses, times out, answers non-200 or sends too much is reported down with the reason; the
rest go on. On a large job every other plain-HTTP target is scraped, parsed and filed the same
way by a helper process (helper.py), so that a refresh uses two cores.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlencode, urlsplit

from fsdpmon.errors import ConfigError
from fsdpmon.top.aggregate import JobAggregator, ScrapeResult, Target
from fsdpmon.top.expfmt import Parser
from fsdpmon.top.filing import Acc, new_result
from fsdpmon.top.fused import FilingParser, new_filing_parser
from fsdpmon.top.snapshot import JobSnapshot
from fsdpmon.top.sources.cadence import SLOW_NAMES, Cadence
from fsdpmon.top.sources.gcpause import collector_paused
from fsdpmon.top.sources.helper import SPLIT_MIN_TARGETS, Helper
from fsdpmon.top.sources.httpget import IN_FLIGHT, ScrapeError, get_all, http_get


def normalise_url(url: str, field: str = "--targets") -> str:
    """``host:port`` or ``http://host:port[/path]`` → a full URL (path defaults to /metrics)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. "Invalid IPv6 URL" for an unclosed bracket
        raise ConfigError(field, f"{url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(field, f"{url!r} is not an http(s) URL or host:port")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ConfigError(field, f"{url!r} has an invalid port") from None
    return text if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


Fetcher = Callable[[Target], bytes]


def scrape_all(
    targets: Sequence[Target], fetch: Fetcher, parser: Parser, pool: ThreadPoolExecutor
) -> list[ScrapeResult]:
    """Fetch and parse every target on a thread pool; results keep the targets' order.

    For fetchers that block (the Kubernetes client's pod proxy); plain URLs go through
    scrape_urls instead.
    """

    def one(target: Target) -> ScrapeResult:
        start = time.monotonic()
        try:
            body = fetch(target)
        except ScrapeError as exc:
            return _parsed(target, None, str(exc), time.monotonic() - start, parser)
        return _parsed(target, body, "", time.monotonic() - start, parser)

    return list(pool.map(one, targets))


def _parsed(
    target: Target, body: bytes | None, error: str, duration_s: float, parser: Parser,
    into: Acc | None = None,
) -> ScrapeResult:
    """The result of one scrape; with ``into`` (and a FilingParser), its stored figures are
    filed there as the body is read."""
    if body is None:
        return ScrapeResult(target, None, error, duration_s)
    try:
        if into is not None and isinstance(parser, FilingParser):
            samples, filed = parser.parse_into(body, into, target)
            return new_result(target=target, samples=samples, duration_s=duration_s, filed=filed)
        samples = parser.parse(body)
    except Exception as exc:  # a parser bug must not take the whole view down
        return ScrapeResult(target, None, f"unreadable exposition: {exc}", duration_s)
    return ScrapeResult(target, samples, "", duration_s)


def with_names(url: str, names: Iterable[str] | None) -> str:
    """``url`` asking only for the series called ``names``: Prometheus's ``name[]`` filter,
    which prometheus_client's handler (the monitor, the exporter) honours. A server that
    ignores it sends everything, and the parser's own name filter still applies."""
    if not names:
        return url
    query = _names_query(names if isinstance(names, frozenset) else frozenset(names))
    return f"{url}{'&' if '?' in url else '?'}{query}"


@functools.lru_cache(maxsize=16)  # a handful of name sets, asked of every target each refresh
def _names_query(names: frozenset[str]) -> str:
    return urlencode([("name[]", n) for n in sorted(names)])


def scrape_urls(
    targets: Sequence[Target], parser: Parser, timeout_s: float, limit: int,
    pool: ThreadPoolExecutor | None, add: Callable[[int, ScrapeResult], None],
    names: Iterable[str] | None = None, into: Callable[[], Acc] | None = None,
) -> int:
    """Scrapes every target's URL (asking for ``names`` only, when given); ``add`` gets each
    result (with the target's index) on this thread as soon as it is parsed. Returns the
    bytes of the bodies received. With ``into``, which gives the accumulators ``add`` files the
    next result into, a FilingParser files its stored figures there as it reads (see fused).

    Plain-HTTP targets share one selector loop on this thread (httpget.get_all); https ones
    are fetched by blocking GETs on ``pool`` meanwhile (TLS and its certificate checks).
    """
    plain = [i for i, t in enumerate(targets) if t.url.startswith("http:")]
    if isinstance(parser, FilingParser):  # its bodies' layouts are kept per names asked
        parser.asking(names if names is None or isinstance(names, frozenset) else frozenset(names))
    tls: dict[int, Future[tuple[bytes | None, str, float]]] = {}
    if len(plain) < len(targets):
        if pool is None:
            raise ValueError("https targets need a thread pool")
        tls = {i: pool.submit(_timed_get, with_names(t.url, names), timeout_s)
               for i, t in enumerate(targets) if not t.url.startswith("http:")}
    received = 0

    def file(j: int, body: bytes | None, error: str, duration_s: float) -> None:
        nonlocal received
        i = plain[j]
        received += len(body or b"")
        add(i, _parsed(targets[i], body, error, duration_s, parser, into and into()))

    get_all([with_names(targets[i].url, names) for i in plain], timeout_s, limit, file)
    for i, future in tls.items():
        body, error, duration_s = future.result()
        received += len(body or b"")
        add(i, _parsed(targets[i], body, error, duration_s, parser, into and into()))
    return received


def _timed_get(url: str, timeout_s: float) -> tuple[bytes | None, str, float]:
    start = time.monotonic()
    try:
        return http_get(url, timeout_s), "", time.monotonic() - start
    except ScrapeError as exc:
        return None, str(exc), time.monotonic() - start


class TargetsSource:
    """Scrapes fixed URLs; ``fetch()`` returns a fresh JobSnapshot each call.

    With ``split`` (the default: when there are SPLIT_MIN_TARGETS plain-HTTP targets or more and
    a second CPU), every other plain-HTTP target is scraped, parsed and filed by a helper process
    (helper.py) while this one does the rest: a refresh then uses two cores.
    """

    def __init__(
        self, urls: Sequence[str], timeout_s: float = 2.0, max_workers: int = 16,
        job_name: str = "", split: bool | None = None,
    ) -> None:
        if not urls:
            raise ConfigError("--targets", "give at least one URL")
        if not timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {timeout_s!r}")
        self.targets = [Target(normalise_url(u)) for u in urls]
        self.timeout_s = timeout_s
        self.job_name = job_name
        self._parser = new_filing_parser(samples_of=SLOW_NAMES)  # the cadence keeps those
        self._limit = min(IN_FLIGHT, len(self.targets))  # plain HTTP, split with the helper
        tls = any(not t.url.startswith("http:") for t in self.targets)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(self.targets)))
                                        ) if tls else None
        self._previous: JobSnapshot | None = None
        self.bytes_received = 0  # by the last refresh
        self.helper_cpu_s = 0.0  # the helper process's CPU time in the last refresh
        self.cadence = Cadence()
        plain = [i for i, t in enumerate(self.targets) if t.url.startswith("http:")]
        if split is None:
            split = len(plain) >= SPLIT_MIN_TARGETS and (os.cpu_count() or 1) >= 2
        self._theirs = plain[1::2] if split else []  # the helper's targets
        theirs = set(self._theirs)
        self._own = [i for i in range(len(self.targets)) if i not in theirs]
        self._helper: Helper | None = None

    @property
    def description(self) -> str:
        return f"{len(self.targets)} target(s)"

    @property
    def helper_pid(self) -> int | None:
        """The helper process's id while one runs."""
        return self._helper.process.pid if self._helper is not None else None

    def showing(self, view: str, processes: bool = False) -> None:
        """The view on screen, and whether process figures are on it (``processes``; the
        Processes view always): the process families then come on every refresh."""
        self.cadence.processes_open = processes or view == "processes"

    def fetch(self) -> JobSnapshot:
        with collector_paused():
            self._previous = self._refresh()
        return self._previous

    def _refresh(self) -> JobSnapshot:
        # The samples die when this returns, before the collector resumes: its first pass
        # then sees only the new snapshot, not the ~60k samples it was built from.
        aggregator = JobAggregator()
        cadence = self.cadence
        names = cadence.names()
        helper = self._ask_helper(names)
        own, acc = self._own, aggregator.acc
        self.bytes_received = scrape_urls(
            [self.targets[i] for i in own], self._parser, self.timeout_s,
            max(1, self._limit // 2) if helper else self._limit, self._pool,
            lambda i, result: aggregator.add(own[i], cadence.complete(result)), names,
            lambda: acc)
        if helper is not None:
            self._take_share(helper, aggregator)
        snap = aggregator.snapshot(now=time.time(), source="targets", previous=self._previous,
                                   job_name=self.job_name,
                                   processes_asked=cadence.processes_asked)
        cadence.check(snap)
        return snap

    def _ask_helper(self, names: frozenset[str]) -> Helper | None:
        if not self._theirs:
            return None
        if self._helper is None:
            self._helper = Helper([self.targets[i].url for i in self._theirs], self.timeout_s,
                                  max(1, self._limit - self._limit // 2))
        with contextlib.suppress(OSError, ValueError):  # it exited: _take_share says why
            self._helper.ask(names)
        return self._helper

    def _take_share(self, helper: Helper, aggregator: JobAggregator) -> None:
        """Merges the helper's share, part by part (helper.Share), as its parts come."""
        theirs, got = self._theirs, set()
        while True:
            share = helper.answer()
            if isinstance(share, str):  # its targets are down for this refresh; next, a new one
                self._helper = None
                self.cadence.note_lacking()
                for i in theirs:
                    if i not in got:
                        aggregator.add(i, ScrapeResult(self.targets[i], None, share))
                return
            statuses = {theirs[j]: s for j, s in share.statuses.items()}
            down = {theirs[j]: r for j, r in share.down.items()}
            aggregator.add_filed(share.acc, statuses, down)
            if share.last:
                break
            got.update(statuses, down)
        self.bytes_received += share.received
        self.helper_cpu_s = share.cpu_s
        if share.lacking:
            self.cadence.note_lacking()

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
