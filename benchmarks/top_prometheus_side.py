"""`--prometheus` refresh on a large job, this tree against a base revision, in one run.

Each version backfills its own synthetic job (tests/synthetic_job.py as that version has it:
every per-rank series of its catalog, the progress evidence included in this one) into a real
Prometheus and times PrometheusSource refreshes (benchmarks/top_prometheus.py's ``measure``),
the two versions in alternating rounds so that machine drift hits both alike. Prints each
round's p50 and the ratio of the medians (this tree / base): the progress series may cost a
--prometheus refresh at most 1.5x.

Run: ``.venv/bin/python benchmarks/top_prometheus_side.py [--base REF] [NODES GPUS]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_progress_cost import BEFORE_PROGRESS
from bench_progress_cost import extract as base_tree

REPO = Path(__file__).resolve().parents[1]
PROBE = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import top_prometheus
r = top_prometheus.measure("llama2-7b", int(sys.argv[1]), int(sys.argv[2]))
print("RESULT " + json.dumps(r))
"""


def probe(tree: Path, nodes: int, gpus: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", PROBE, str(nodes), str(gpus)], cwd=tree, env=env,
                         check=True, capture_output=True, text=True, timeout=1800).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default=BEFORE_PROGRESS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("nodes", type=int, nargs="?", default=256)
    p.add_argument("gpus", type=int, nargs="?", default=8)
    args = p.parse_args()
    load = os.getloadavg()[0]
    rows: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = base_tree(args.base, Path(tmp))  # both trees run the same Python scrape layer
        for _ in range(args.rounds):
            for name, tree in (("base", base), ("head", REPO)):
                rows[name].append(probe(tree, args.nodes, args.gpus))
    print(f"--prometheus refresh, {args.nodes} x {args.gpus} ranks, {args.rounds} alternating "
          f"rounds, base {args.base} vs this tree; load {load:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs")
    med = {}
    for name, results in rows.items():
        med[name] = statistics.median(r["p50_s"] for r in results)
        r = results[-1]
        per_round = ", ".join(f"{x['p50_s'] * 1e3:.0f}" for x in results)
        print(f"  {name}: refresh p50 per round {per_round} ms; {r['ranks']} ranks, "
              f"{r['series']} series, {r['queries']:.0f} queries answering {r['answered']:.0f} "
              f"series; slowest query {r['slowest_query_s'] * 1e3:.0f} ms: {r['slowest_query']}")
    print(f"  ratio this tree / base (medians): {med['head'] / med['base']:.3f} (bound 1.5)")


if __name__ == "__main__":
    main()
