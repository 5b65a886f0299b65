"""Plain scrape targets (`--targets URL,...`): concurrent HTTP scrapes, bounded and timed out.

Every target is fetched by a bounded thread pool with a per-target deadline; the body is parsed
in the same worker as soon as it arrives (only the series `top` reads). A target that refuses,
times out, answers non-200 or sends too much is reported down with the reason; the rest go on.
"""

from __future__ import annotations

import gc
import http.client
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import urlsplit

from fsdpmon.errors import ConfigError
from fsdpmon.top.aggregate import ScrapeResult, Target, aggregate, new_parser
from fsdpmon.top.expfmt import Parser, decode
from fsdpmon.top.snapshot import JobSnapshot

MAX_BODY_BYTES = 64 * 1024 * 1024  # a pod serving more than this is broken or hostile
# Bodies are read in pieces this large so that the deadline is checked between them; an
# exposition (~60 KiB a pod) is one read, with no join copy.
_CHUNK = 1 << 20


class ScrapeError(Exception):
    """One target failed; the message is what the view shows next to it."""


def normalise_url(url: str, field: str = "--targets") -> str:
    """``host:port`` or ``http://host:port[/path]`` → a full URL (path defaults to /metrics)."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(field, f"{url!r} is not an http(s) URL or host:port")
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise ConfigError(field, f"{url!r} has an invalid port") from None
    return text if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def http_get(
    url: str, timeout_s: float, max_bytes: int = MAX_BODY_BYTES, error_body: bool = False
) -> bytes:
    """GET ``url``; raises ScrapeError with a short reason on any failure.

    With ``error_body`` the start of a non-200 answer's body joins the reason (APIs that
    explain their errors, like Prometheus).
    """
    parts = urlsplit(url)
    https = parts.scheme == "https"
    conn_cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
    deadline = time.monotonic() + timeout_s
    conn = conn_cls(parts.hostname or "", parts.port, timeout=timeout_s)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path or "/", headers={"Accept": "text/plain"})
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read(300).decode("utf-8", "replace").strip() if error_body else ""
            raise ScrapeError(f"HTTP {response.status} {response.reason}"
                              + (f": {detail}" if detail else ""))
        if response.length is not None and response.length > max_bytes:
            raise ScrapeError(f"body larger than {max_bytes} bytes")
        chunks, size = [], 0
        while chunk := response.read(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise ScrapeError(f"body larger than {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise ScrapeError(f"timed out after {timeout_s:g}s")
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except (TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
        raise ScrapeError(_reason(exc)) from None
    finally:
        conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return str(exc) or type(exc).__name__


Fetcher = Callable[[Target], bytes]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Holds off Python's cyclic garbage collector for one refresh.

    A refresh of a large job allocates ~100k short-lived containers (samples, rows, HTTP
    objects); left alone, the collector runs ~120 passes and one full pass per refresh that
    walks the parser's label caches (~50 ms of a ~400 ms refresh for 2048 ranks on 2 cores).
    Reference counting still frees everything at once; cycles wait for the next pass after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def scrape_all(
    targets: Sequence[Target], fetch: Fetcher, parser: Parser, pool: ThreadPoolExecutor
) -> list[ScrapeResult]:
    """Fetch and parse every target concurrently; results keep the targets' order."""

    def one(target: Target) -> ScrapeResult:
        start = time.monotonic()
        try:
            body = fetch(target)
        except ScrapeError as exc:
            return ScrapeResult(target, None, str(exc), time.monotonic() - start)
        try:
            samples = parser.parse(decode(body))
        except Exception as exc:  # a parser bug must not take the whole view down
            return ScrapeResult(target, None, f"unreadable exposition: {exc}",
                                time.monotonic() - start)
        return ScrapeResult(target, samples, "", time.monotonic() - start)

    return list(pool.map(one, targets))


class TargetsSource:
    """Scrapes fixed URLs; ``fetch()`` returns a fresh JobSnapshot each call."""

    def __init__(
        self, urls: Sequence[str], timeout_s: float = 2.0, max_workers: int = 16,
        job_name: str = "",
    ) -> None:
        if not urls:
            raise ConfigError("--targets", "give at least one URL")
        if not timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {timeout_s!r}")
        self.targets = [Target(normalise_url(u)) for u in urls]
        self.timeout_s = timeout_s
        self.job_name = job_name
        self._parser = new_parser()
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(self.targets))),
                                        thread_name_prefix="fsdpmon-scrape")
        self._previous: JobSnapshot | None = None

    @property
    def description(self) -> str:
        return f"{len(self.targets)} target(s)"

    def fetch(self) -> JobSnapshot:
        with collector_paused():
            self._previous = self._refresh()
        return self._previous

    def _refresh(self) -> JobSnapshot:
        # The samples die when this returns, before the collector resumes: its first pass
        # then sees only the new snapshot, not the ~60k samples it was built from.
        results = scrape_all(self.targets, lambda t: http_get(t.url, self.timeout_s),
                             self._parser, self._pool)
        return aggregate(results, now=time.time(), source="targets", previous=self._previous,
                         job_name=self.job_name)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
