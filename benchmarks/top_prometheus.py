"""`fsdpmon top --prometheus` on a large job: a real Prometheus holding a synthetic job's series.

The job's expositions (tests/synthetic_job.py) are turned into what Prometheus would have
scraped (every series top queries, with the ``job``/``instance`` labels a scrape adds, and
``up``), a few samples per series over the last minute, written as OpenMetrics and backfilled
with ``promtool tsdb create-blocks-from openmetrics``; a Prometheus on loopback then serves
them. Used by bench_top.py; run alone: ``python benchmarks/top_prometheus.py [NODES GPUS]``.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from prometheus_stack import run_prometheus
from synthetic_job import job_expositions

from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.sources.prometheus import PrometheusSource
from fsdpmon.scrape.wanted import WANTED

STEPS = (60, 30, 5)  # seconds before now: the last one within the 5-minute instant lookback


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def openmetrics(job: str, nodes: int, gpus: int, now: float) -> tuple[str, int]:
    """(the job's series as an OpenMetrics backfill file, series count): families contiguous,
    timestamps rising within each series, as promtool requires."""
    families: dict[str, list[str]] = {}
    parser = Parser(WANTED)
    for path, body in sorted(job_expositions(job, nodes, gpus).items()):
        scrape = {"job": path.strip("/").split("/")[0], "instance": f"10.0.0.1:{path}"}
        for s in [*parser.parse(body), ("up", {}, 1.0)]:
            name, labels, value = s
            families.setdefault(name, []).append(
                f"{name}{{{_label_text({**labels, **scrape})}}} {value!r}")
    lines, series = [], 0
    for name, rows in families.items():
        lines.append(f"# TYPE {name} gauge" if not name.endswith("_total") else
                     f"# TYPE {name[:-6]} counter")
        for row in rows:
            series += 1
            lines.extend(f"{row} {now - ago:.3f}" for ago in STEPS)
    lines.append("# EOF")
    return "\n".join(lines) + "\n", series


def measure(job: str, nodes: int, gpus: int, refreshes: int = 5) -> dict[str, float]:
    """Backfills the job, starts Prometheus on it, times ``refreshes`` refreshes of the source."""
    with tempfile.TemporaryDirectory(prefix="fsdpmon-bench-prom-") as tmp:
        work = Path(tmp)
        text, series = openmetrics(job, nodes, gpus, time.time())
        (work / "job.om").write_text(text)
        started = time.perf_counter()
        subprocess.run([shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from",
                        "openmetrics", "-q", str(work / "job.om"), str(work / "tsdb")],
                       check=True, capture_output=True, timeout=600)
        backfill_s = time.perf_counter() - started
        with run_prometheus(work, {"scrape_configs": []}, tsdb=work / "tsdb") as prom:
            source = PrometheusSource(prom.url, job_name=job, timeout_s=60)
            per_query: dict[str, list[float]] = {}
            plain_query = source.query

            returned = [0]  # series answered, all queries

            def timed_query(promql: str) -> list:
                start = time.perf_counter()
                try:
                    result = plain_query(promql)
                    returned[0] += len(result)
                    return result
                finally:
                    per_query.setdefault(promql[:40], []).append(time.perf_counter() - start)

            source.query = timed_query  # type: ignore[method-assign]
            snap = source.fetch()  # warm-up: Prometheus loads the blocks' index pages
            times, queries, answered = [], [], []
            for _ in range(refreshes):
                before, start, returned[0] = source.queries, time.perf_counter(), 0
                snap = source.fetch()
                times.append(time.perf_counter() - start)
                queries.append(source.queries - before)
                answered.append(returned[0])
            source.close()
    return {"series": series, "backfill_s": backfill_s, "ranks": len(snap.ranks),
            "gpus": len(snap.gpus), "targets": len(snap.targets),
            "p50_s": statistics.median(times), "max_s": max(times),
            "queries": statistics.median(queries), "answered": statistics.median(answered),
            "slowest_query": max(per_query, key=lambda q: statistics.median(per_query[q])),
            "slowest_query_s": max(statistics.median(v) for v in per_query.values())}


def report(nodes: int, gpus: int) -> str:
    r = measure("llama2-7b", nodes, gpus)
    return (f"Prometheus source (--prometheus), {nodes} x {gpus} = {r['ranks']} ranks, "
            f"{r['gpus']} GPUs, {r['targets']} targets, {r['series']} series backfilled "
            f"(promtool {r['backfill_s']:.0f} s): refresh p50 {r['p50_s'] * 1e3:.0f} ms, "
            f"max {r['max_s'] * 1e3:.0f} ms, {r['queries']:.0f} queries per refresh answering "
            f"{r['answered']:.0f} series (p50); slowest "
            f"query p50 {r['slowest_query_s'] * 1e3:.0f} ms: {r['slowest_query']}...")


if __name__ == "__main__":
    n, g = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (256, 8)
    print(report(n, g))
