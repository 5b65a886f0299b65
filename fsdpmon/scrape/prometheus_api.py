"""Prometheus' HTTP API, the one client of it: instant queries and the federation endpoint for
`top --prometheus`, range queries for `report --prometheus`.

Each query is a POST with a form body, as Prometheus takes on both endpoints, so a long query
(a large job's instance matcher) meets no URL length limit; the exchange is the scrapes'
(httpget), so a refused or slow server reads the same as a silent pod. Every failure is one
UnreachableError line naming the server: what Prometheus said (its errorType and error, which
it sends with 400, 422 and 503), else the HTTP status, else what was wrong with the answer.
VictoriaMetrics' Prometheus-compatible API answers the same queries (tests/test_e2e_victoria.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

from fsdpmon.errors import ConfigError, UnreachableError
from fsdpmon.scrape.httpget import ScrapeError, http_exchange

MAX_ANSWER_BYTES = 512 * 1024 * 1024  # a 2048-rank job's instant vector is far below this
MAX_ERROR_BYTES = 64 * 1024  # Prometheus' error documents are a line or two
# The escapes _unjson decodes: VictoriaMetrics' /federate writes label values with JSON \uXXXX
# escapes, which the exposition format does not have. An escaped backslash is matched too, and
# kept, so that a "u" after it is not read as the start of an escape.
_JSON_ESCAPE = re.compile(rb"\\\\|\\u([0-9a-fA-F]{4})")
_OWN_ESCAPES = {'"': b'\\"', "\\": b"\\\\", "\n": b"\\n"}  # the format's own three


class PrometheusAPI:
    """Queries against the server at ``base_url`` (http(s)://host:port[/prefix])."""

    def __init__(self, base_url: str, timeout_s: float = 30.0,
                 field: str = "--prometheus") -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(field, f"{base_url!r} is not an http(s) URL")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector: its results that carry a label set."""
        # nocache=1: VictoriaMetrics (its Prometheus-compatible API) otherwise answers an
        # instant query for "now" as of -search.latencyOffset ago (30 s by default), hiding the
        # newest scrapes and shifting time(); Prometheus ignores the parameter.
        result = self._call("query", {"query": promql, "nocache": "1"}).get("result")
        if not isinstance(result, list):
            raise UnreachableError(f"{self._where}: answer has no result list")
        return [r for r in result if isinstance(r, dict) and isinstance(r.get("metric"), dict)]

    def query_range(self, promql: str, start: float, end: float,
                    step: float) -> list[dict[str, Any]]:
        """A range query's matrix: one series per label set, its ``values`` as served."""
        data = self._call("query_range", {"query": promql, "start": f"{start:.3f}",
                                          "end": f"{end:.3f}", "step": f"{step:g}"})
        result = data.get("result")
        if data.get("resultType") != "matrix" or not isinstance(result, list):
            raise UnreachableError(f"{self._where}: expected a matrix result for {promql!r}")
        return [series for series in result if isinstance(series, dict)]

    def federate(self, selectors: Sequence[str]) -> bytes:
        """The newest sample of every series matching any of ``selectors`` (series selectors,
        not expressions) in the text exposition format, from /federate: at 2,048 ranks it costs
        the server about half the CPU of the same instant query, which it encodes in JSON
        (docs/benchmarks.md, bench_page_scale.py). Prometheus serves it on GET only."""
        url = f"{self.base_url}/federate?" + urlencode([("match[]", s) for s in selectors])
        try:
            status, reason, raw = http_exchange(url, self.timeout_s, MAX_ANSWER_BYTES,
                                                error_bytes=MAX_ERROR_BYTES)
        except ScrapeError as exc:
            raise UnreachableError(f"{self._where}: {exc}") from None
        if status != 200:  # Prometheus explains a bad selector in a line of plain text
            said = raw.decode("utf-8", "replace").strip().splitlines()[:1]
            raise UnreachableError(f"{self._where}: /federate answered HTTP {status} {reason}"
                                   + (f": {said[0][:300]}" if said else ""))
        return _unjson(raw)

    @property
    def _where(self) -> str:
        return f"Prometheus at {self.base_url}"

    def _call(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        """The ``data`` of a successful answer from /api/v1/<endpoint>."""
        try:
            status, reason, raw = http_exchange(
                f"{self.base_url}/api/v1/{endpoint}", self.timeout_s, MAX_ANSWER_BYTES,
                form=urlencode(params).encode(), error_bytes=MAX_ERROR_BYTES)
        except ScrapeError as exc:
            raise UnreachableError(f"{self._where}: {exc}") from None
        try:
            payload = json.loads(raw)
        except ValueError:  # not JSON, or not UTF-8
            payload = None
        if not isinstance(payload, dict):
            raise UnreachableError(f"{self._where}: " + (
                "not a Prometheus API response" if status == 200 else f"HTTP {status} {reason}"))
        if payload.get("status") != "success":
            raise UnreachableError(f"{self._where}: {payload.get('errorType') or 'error'}: "
                                   f"{payload.get('error') or f'HTTP {status} {reason}'}")
        data = payload.get("data")
        if not isinstance(data, dict):
            raise UnreachableError(f"{self._where}: answer has no data")
        return data


def _unjson(body: bytes) -> bytes:
    """The exposition with label values as Prometheus writes them: VictoriaMetrics' /federate
    writes them as JSON strings, ``<`` and ``'`` as ``\\u003c`` and ``\\u0027`` (a stack site
    "train.py:3 in <module>" would come back mangled); each such escape becomes its character."""
    if b"\\u" not in body:  # Prometheus' answer: scanned, not copied
        return body

    def one(match: re.Match[bytes]) -> bytes:
        if match.group(1) is None:
            return match.group(0)  # an escaped backslash stays, with what follows it
        char = chr(int(match.group(1), 16))
        return _OWN_ESCAPES.get(char) or char.encode("utf-8", "surrogatepass")

    return _JSON_ESCAPE.sub(one, body)
