"""What publishing the progress evidence costs per step, side by side with the code before it.

The progress evidence (the collective numbers, inside or not, the phase and since when) rides
on the heartbeat the monitor already writes every step, and the collective wrapper stores one
more number per call. This measures both against a base revision (default ``integ``), each
tree in its own interpreter, in alternating rounds (so machine load hits both alike):

1. the monitor's host cost per non-log step (step + 4 phases + record, against no-op spans:
   bench_monitor's loop), in microseconds;
2. the collective wrapper's cost per call, armed as in a step (bench_monitor's part 4), in
   microseconds;
3. the tiny Llama step without a monitor (bench_monitor's model and batch) and the collectives
   a tiny 2-rank step makes, once, to state both differences per step as a share of a tiny
   step: the budget is 0.5% for the whole monitor.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_progress_cost.py [--base REF]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE_PROGRESS = "750adef"  # main just before issue 41's progress evidence

# Runs inside one tree (its own fsdpmon and benchmarks on sys.path); prints one JSON line.
PROBE = r"""
import json, statistics, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
import bench_monitor as bm
from fsdpmon.monitor import collectives

steps, repeats, calls = (int(a) for a in sys.argv[1:4])
with tempfile.TemporaryDirectory() as tmp:
    bm.host_cost(Path(tmp), steps, repeats)
host_us = bm.FIGURES["host_us"]

def raw(*args, **kwargs):
    return None

# bench_monitor.attribution_cost's loop, written out: this runs against the base tree too, whose
# bench_monitor has no function for one wrapper alone (it times three variants in one loop).
timer = collectives.CollectiveTimer()
wrapped = collectives.wrap("all_reduce", raw)
collectives._calls.timer = timer
per_call = []
for _ in range(repeats):
    timer.arm()
    start = time.perf_counter()
    for _ in range(calls):
        raw(1, group=None)
    mid = time.perf_counter()
    for _ in range(calls):
        wrapped(1, group=None)
    end = time.perf_counter()
    timer.step_done()
    timer.drain()
    per_call.append(((end - mid) - (mid - start)) / calls)
collectives._calls.timer = None
print("RESULT " + json.dumps({"host_us": host_us, "call_us": statistics.median(per_call) * 1e6}))
"""

TINY = r"""
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
import bench_monitor as bm
with tempfile.TemporaryDirectory() as tmp:
    bm.training_comparison(Path(tmp), int(sys.argv[1]), 10, 128)
    calls = bm.collectives_per_step(Path(tmp))
print("RESULT " + json.dumps([bm.FIGURES.get("step_s", float("nan")), calls]))
"""


def extract(ref: str, into: Path) -> Path:
    """The base revision's files (git archive: nothing in any checkout changes)."""
    archive = into / "base.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), ref], cwd=REPO,
                   check=True)
    tree = into / "base"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def probe(tree: Path, code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree, env=env, check=True,
                         capture_output=True, text=True, timeout=900).stdout
    return next(line for line in out.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default=BEFORE_PROGRESS, help="the revision to compare with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--host-steps", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--tiny-steps", type=int, default=100)
    args = p.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        base = extract(args.base, Path(tmp))
        figures: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
        for _ in range(args.rounds):
            for name, tree in (("base", base), ("head", REPO)):
                figures[name].append(json.loads(probe(
                    tree, PROBE, str(args.host_steps), str(args.repeats), str(args.calls))))
        tiny, calls = json.loads(probe(REPO, TINY, str(args.tiny_steps)))
    print(f"progress evidence cost, {args.rounds} alternating rounds, base {args.base} vs this "
          f"tree; load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end, "
          f"{os.cpu_count()} CPUs")
    med = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
           for name, rows in figures.items()}
    for key, what, per_step in (("host_us", "monitor host cost per non-log step", 1.0),
                                ("call_us", "collective wrapper per call, armed", calls)):
        b, h = med["base"][key], med["head"][key]
        print(f"  {what:<38} base {b:6.2f} us   head {h:6.2f} us   difference {h - b:+6.2f} us"
              f" x {per_step:g} per step = {(h - b) * per_step * 1e-6 / tiny:+.4%} of a tiny "
              "step")
    print(f"  tiny Llama step without monitor: {tiny * 1e3:.1f} ms; {calls:g} collectives per "
          f"step of the tiny 2-rank job; every round: {json.dumps(figures)}")


if __name__ == "__main__":
    main()
