"""Plain scrape targets (`--targets URL,...`): concurrent HTTP scrapes, bounded and timed out.

Every target is fetched with a per-target deadline, at most ``httpget.IN_FLIGHT`` at a time, by
one selector loop on the refreshing thread (`httpget.get_all`); each body is parsed and
aggregated on that thread as soon as it arrives (only the series `top` reads). HTTPS targets go
through blocking GETs on a thread pool (``max_workers`` threads) meanwhile. A target that
refuses, times out, answers non-200 or sends too much is reported down with the reason; the
rest go on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from fsdpmon.errors import ConfigError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import JobAggregator, Target
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.fetch import scrape_urls
from fsdpmon.scrape.fused import new_filing_parser
from fsdpmon.scrape.gcpause import collector_paused
from fsdpmon.scrape.httpget import IN_FLIGHT
from fsdpmon.scrape.sources.cadence import SLOW_NAMES, Cadence


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


class TargetsSource:
    """Scrapes fixed URLs; ``fetch()`` returns a fresh JobSnapshot each call."""

    def __init__(
        self, urls: Sequence[str], timeout_s: float = 2.0, max_workers: int = 16,
        job_name: str = "", parser: Parser | None = None,
    ) -> None:
        if not urls:
            raise ConfigError("--targets", "give at least one URL")
        if not timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {timeout_s!r}")
        self.targets = [Target(normalise_url(u)) for u in urls]
        self.timeout_s = timeout_s
        self.job_name = job_name
        # What reads the bodies: by default one that files as it reads (fused.py), returning
        # the families the cadence keeps as samples.
        self._parser = parser or new_filing_parser(samples_of=SLOW_NAMES)
        self._limit = min(IN_FLIGHT, len(self.targets))  # plain HTTP requests in flight
        tls = any(not t.url.startswith("http:") for t in self.targets)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(self.targets)))
                                        ) if tls else None
        self._previous: JobSnapshot | None = None
        self.bytes_received = 0  # by the last refresh
        self.cadence = Cadence()

    @property
    def description(self) -> str:
        return f"{len(self.targets)} target(s)"

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
        acc = aggregator.acc
        self.bytes_received = scrape_urls(
            self.targets, self._parser, self.timeout_s, self._limit, self._pool,
            lambda i, result: aggregator.add(i, cadence.complete(result)), names, lambda: acc)
        snap = aggregator.snapshot(now=time.time(), source="targets", previous=self._previous,
                                   job_name=self.job_name,
                                   processes_asked=cadence.processes_asked)
        cadence.check(snap)
        return snap

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
