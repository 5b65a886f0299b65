"""The recorded matrix in a real Prometheus: every recording's scrapes backfilled with
``promtool tsdb create-blocks-from openmetrics`` (what Prometheus would have stored, at the
recorded times), then the Prometheus doors over it: `diagnose --prometheus` (PrometheusSource
and the judge, refreshed at each recorded moment) and `incidents --prometheus` (its range
queries).

What a scrape adds is added: ``job`` and ``instance`` labels, and ``up`` (0 where the recorded
scrape failed). Each recording is its own job on its own node (its ``job_name`` and ``node``
labels become its slug), as two jobs in one Prometheus are. A backfill cannot write the
staleness marker a live scrape writes when a series goes, so Prometheus runs with a lookback
of STALE_AFTER_S, a little over the recording's scrape spacing, in its place.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from matrix_doors import Named, Recording, _Clock
from prometheus_stack import run_prometheus

from fsdpmon.diagnose import SnapshotHistory, judge
from fsdpmon.incidents.history import job_incidents
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.prometheus_api import PrometheusAPI
from fsdpmon.scrape.sources import prometheus as prometheus_module
from fsdpmon.scrape.sources.prometheus import PrometheusSource

STALE_AFTER_S = 2  # the recordings' scrapes are 0.9-1.2 s apart
TARGET_JOBS = ("fsdpmon-train", "fsdpmon-exporter")  # the scrape jobs, by target index
RELABELLED = {"job_name": "e2e-diagnose", "node": "vm"}  # the recorded values of the two


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))


Scraped = dict[str, dict[str, list[tuple[float, float]]]]
_SCRAPED: dict[str, Scraped] = {}  # slug -> scraped(): the backfill and the rules read it


def scraped(rec: Recording) -> Scraped:
    """name -> label text -> [(t, value)], as Prometheus would have stored the scrapes."""
    if rec.slug not in _SCRAPED:
        _SCRAPED[rec.slug] = _scrape(rec)
    return _SCRAPED[rec.slug]


def _scrape(rec: Recording) -> Scraped:
    out: Scraped = {}
    parser = Parser()
    for frame in rec.frames:
        for index, body in enumerate(frame["metrics"]):
            scrape = {"job": TARGET_JOBS[index], "instance": f"{rec.slug}:{9520 + index}"}
            samples = [("up", {}, 0.0 if body is None else 1.0)]
            samples += parser.parse(body) if body is not None else []
            for name, labels, value in samples:
                labels = {k: (rec.slug if RELABELLED.get(k) == v else v)
                          for k, v in labels.items()}
                series = out.setdefault(name, {}).setdefault(_labels({**labels, **scrape}), [])
                series.append((frame["t"], value))
    return out


def openmetrics(recs: list[Recording]) -> str:
    """One backfill file: families contiguous, each series' samples in time order."""
    families: Scraped = {}
    for rec in recs:
        for name, series in scraped(rec).items():
            families.setdefault(name, {}).update(series)
    lines = []
    for name, series in families.items():
        counter = name.endswith("_total")
        lines.append(f"# TYPE {name.removesuffix('_total') if counter else name} "
                     f"{'counter' if counter else 'unknown'}")
        for labels, points in series.items():
            lines += [f"{name}{{{labels}}} {v!r} {t:.3f}" for t, v in points]
    return "\n".join([*lines, "# EOF", ""])


@contextlib.contextmanager
def backfilled(recs: list[Recording], workdir: Path) -> Iterator[str]:
    """A Prometheus serving every recording; yields its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "matrix.om").write_text(openmetrics(recs))
    subprocess.run([shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from",
                    "openmetrics", "-q", str(workdir / "matrix.om"), str(workdir / "tsdb")],
                   check=True, capture_output=True, timeout=120)
    with run_prometheus(workdir, {"global": {"scrape_interval": "1h"}}, tsdb=workdir / "tsdb",
                        args=[f"--query.lookback-delta={STALE_AFTER_S}s"]) as prom:
        yield prom.url


class _AtTime(PrometheusAPI):
    """Instant queries at the recording's moment (``clock.now``) instead of now. Prometheus'
    /federate answers for now only, so its selections are asked as an instant query at that
    moment and written back in the exposition format /federate serves (the real endpoint is
    read in test_prometheus_source.py and test_victoria_query.py)."""

    def __init__(self, base_url: str, clock: _Clock) -> None:
        super().__init__(base_url, 30.0)
        self.clock = clock

    def _call(self, endpoint: str, params: dict[str, str]) -> dict:  # type: ignore[override]
        if endpoint == "query":
            params = {**params, "time": f"{self.clock.now:.3f}"}
        return super()._call(endpoint, params)

    def federate(self, selectors: Sequence[str]) -> bytes:
        lines = []
        for r in self.query(" or ".join(selectors)):
            labels = dict(r["metric"])
            name = labels.pop("__name__")
            lines.append(f"{name}{{{_labels(labels)}}} {r['value'][1]}\n")
        return "".join(lines).encode()


def diagnose_prometheus(rec: Recording, url: str) -> Named:
    """`fsdpmon diagnose --prometheus URL --job JOB`, refreshed at every recorded moment (no
    stacks: Prometheus holds none)."""
    clock, said, history = _Clock(), set(), SnapshotHistory()
    source = PrometheusSource(url, job_name=rec.slug, timeout_s=30.0)
    source.api = _AtTime(source.base, clock)
    real_time = prometheus_module.time
    prometheus_module.time = clock  # type: ignore[assignment]
    try:
        for frame in rec.frames:
            clock.now = frame["t"]
            history.push(source.fetch())
            said |= {(f.cause, f.rank) for f in judge(history.snapshots(), ()).findings}
    finally:
        prometheus_module.time = real_time
        source.close()
    return said


def incidents_prometheus(rec: Recording, url: str) -> Named:
    """`fsdpmon incidents --prometheus URL --job JOB --step 1` over the recording's span."""
    found = job_incidents(PrometheusAPI(url), rec.slug, rec.frames[0]["t"],
                          rec.frames[-1]["t"], 1.0)
    return {(i.cause, i.rank) for i in found}
