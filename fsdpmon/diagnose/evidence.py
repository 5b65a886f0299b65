"""The I/O edge of diagnosis: keeps the snapshot history, fetches `/stacks` from the training
pods while a rank is stalled, and runs the pure engine.

`/stacks` is served beside `/metrics` on the same listener, so its URL is the metrics URL with
the last path segment swapped; through the Kubernetes API the source's own pod proxy fetches it.
Bodies are untrusted: size-bounded, parsed without trust, and a pod that fails only loses its
own evidence.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose import RankStack, SnapshotHistory, Verdict, judge, parse_stacks
from fsdpmon.job.snapshot import JobSnapshot, TargetStatus
from fsdpmon.scrape.httpget import ScrapeError, get_all, http_get

MAX_STACKS_BYTES = 4 * 1024 * 1024  # a 8-rank pod's bounded document is far below this
MAX_IN_FLIGHT = 16


def stacks_url(metrics_url: str) -> str | None:
    """``http://h:p/metrics`` → ``http://h:p/stacks``; None for what is not an HTTP URL."""
    if not metrics_url.startswith(("http://", "https://")) or "/" not in metrics_url[8:]:
        return None
    base = metrics_url.split("?", 1)[0]
    return base[:base.rfind("/")] + "/stacks"


def needs_stacks(snap: JobSnapshot) -> bool:
    return any((r.stalled or r.unresponsive) and not r.down for r in snap.ranks)


def _decode(body: bytes | None) -> list[RankStack]:
    if body is None or len(body) > MAX_STACKS_BYTES:
        return []
    try:
        return parse_stacks(json.loads(body))
    except (ValueError, RecursionError):
        return []


def fetch_stacks(source: Any, snap: JobSnapshot, timeout_s: float) -> list[RankStack]:
    """Every answering training pod's published stacks (pods that fail add nothing)."""
    train = [t for t in snap.targets if t.up and t.kind == "train"]
    via_proxy = getattr(source, "get_path", None)
    if via_proxy is not None:  # Kubernetes: through the API server, as the scrapes go
        return [s for t in train for s in _decode(_proxied(via_proxy, t))]
    urls = [u for u in (stacks_url(t.url) for t in train) if u]
    bodies: list[bytes | None] = []
    plain = [u for u in urls if u.startswith("http:")]

    def done(_i: int, body: bytes | None, _error: str, _duration: float) -> None:
        bodies.append(body)

    if plain:
        get_all(plain, timeout_s, MAX_IN_FLIGHT, done, max_bytes=MAX_STACKS_BYTES)
    for url in urls:
        if not url.startswith("http:"):
            with contextlib.suppress(ScrapeError):
                bodies.append(http_get(url, timeout_s, max_bytes=MAX_STACKS_BYTES))
    return [s for body in bodies for s in _decode(body)]


def _proxied(get_path: Any, target: TargetStatus) -> bytes | None:
    try:
        return get_path(target, "stacks")  # type: ignore[no-any-return]
    except ScrapeError:
        return None


class Diagnoser:
    """Feeds each new snapshot to the engine with the history it needs."""

    def __init__(self, source: Any, timeout_s: float,
                 span_s: float = DIAGNOSIS_EVIDENCE_SECONDS) -> None:
        self.source, self.timeout_s = source, timeout_s
        self.history = SnapshotHistory()
        self.span_s = span_s

    def update(self, snap: JobSnapshot) -> Verdict:
        self.history.push(snap)
        stacks: Sequence[RankStack] = ()
        if needs_stacks(snap):
            stacks = fetch_stacks(self.source, snap, self.timeout_s)
        return judge(self.history.snapshots(), stacks, self.span_s)
