"""Scraping a list of targets: each body fetched with its own deadline and parsed (and, with a
filing parser, filed) on the calling thread as soon as it arrives: the targets source scrapes
plain URLs through here, the Kubernetes source its pods."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlencode

from fsdpmon.scrape.aggregate import ScrapeResult, Target
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.filing import Acc, new_result
from fsdpmon.scrape.fused import FilingParser
from fsdpmon.scrape.httpget import ScrapeError, get_all, http_get

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
