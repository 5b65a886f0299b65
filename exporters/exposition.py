"""The /metrics WSGI app: each sample is rendered once, however many scrapers ask for it.

Rendering ~2,000 series with prometheus_client costs ~10-20 ms on a small CPU, far more than
building the families. A sample is frozen until the next one, so its exposition is rendered
once per sample and format (with prometheus_client's own encoders, and gzipped once when asked
for), and every scrape in between only renders the two series that must be computed at scrape
time (staleness and sample age) and puts them in front. Gzip output is two gzip members back to
back, which every gzip reader (Go's included) decodes as one stream. A ``name[]`` filter is cut
from the cached rendering (fsdpmon.families.restrict, uncompressed); non-GET requests go to
prometheus_client's plain app.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import CollectorRegistry

from fsdpmon.exporters.collector import (
    ExporterCollector,
    FrozenCollector,
    live_families,
    sample_families,
)
from fsdpmon.exporters.sample import NodeSample
from fsdpmon.exporters.sampler import Sampler
from fsdpmon.families import restrict

OPENMETRICS_EOF = b"# EOF\n"
GZIP_LEVEL = 6


def _registry(families: list[Any]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(FrozenCollector(families))
    return registry


class CachedExposition:
    """A WSGI app serving the sampler's latest sample, rendered once per sample and format."""

    def __init__(self, sampler: Sampler, version: str, simulated: bool) -> None:
        self.sampler = sampler
        self.version = version
        self.simulated = simulated
        self.registry = CollectorRegistry()  # everything, uncached: the fallback path
        self.registry.register(ExporterCollector(sampler, version, simulated))
        self._plain_app = make_wsgi_app(self.registry)
        self._lock = threading.Lock()
        self._sample: NodeSample | None = None
        self._registry_for_sample: CollectorRegistry | None = None
        self._rendered: dict[tuple[str, bool], bytes] = {}
        self.renders = 0  # for tests and the benchmark: how often the big part was rendered

    def _static(self, sample: NodeSample | None, encoder: Callable[[Any], bytes],
                content_type: str, zipped: bool) -> bytes:
        with self._lock:  # concurrent scrapes of a new sample render it once
            if sample is not self._sample or self._registry_for_sample is None:
                families = sample_families(sample, self.sampler.node, self.version,
                                           self.simulated)
                self._sample, self._rendered = sample, {}
                self._registry_for_sample = _registry(families)
            key = (content_type, zipped)
            if key not in self._rendered:
                body = encoder(self._registry_for_sample)
                self._rendered[key] = gzip.compress(body, GZIP_LEVEL) if zipped else body
                self.renders += 1
            return self._rendered[key]

    def render(self, accept: str | None, accept_encoding: str | None) -> tuple[str, bytes, bool]:
        """(content type, body, gzipped) for one scrape."""
        encoder, content_type = choose_encoder(accept or "")
        zipped = gzip_accepted(accept_encoding or "")
        sample = self.sampler.latest()
        static = self._static(sample, encoder, content_type, zipped)
        live = encoder(_registry(live_families(self.sampler, sample)))
        if live.endswith(OPENMETRICS_EOF):  # OpenMetrics: one EOF, at the very end
            live = live[: -len(OPENMETRICS_EOF)]
        if zipped:
            live = gzip.compress(live, GZIP_LEVEL)
        return content_type, live + static, zipped

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        params = parse_qs(environ.get("QUERY_STRING", ""))
        if environ.get("REQUEST_METHOD") != "GET":
            return self._plain_app(environ, start_response)
        names = params.get("name[]")
        content_type, body, zipped = self.render(
            environ.get("HTTP_ACCEPT"), None if names else environ.get("HTTP_ACCEPT_ENCODING"))
        if names:  # Prometheus's filter, cut from the cached rendering
            body = restrict(body, set(names))
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]
