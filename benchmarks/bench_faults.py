"""Does fsdpmon name the right straggler, and nobody on a healthy run? Prints; asserts nothing.

The trainer (tiny model, CPU, gloo) under torchrun, one fault per run from the fault grammar,
the monitor's windows read back from every rank's JSONL (tests/straggler_runs.py):

1. Calibration: a short healthy run per world size gives the step time the data-slow sizes are
   set from (15% and 50% of a step).
2. The matrix: 2 ranks with rank 0 slowed, then rank 1; 4 ranks with rank 2 slowed; compute-slow
   (factor 1.15 and 1.5) and data-slow (15% and 50% of a step); each without and with a
   CPU-bound process beside the job. Windows are BUSY_MIN_STEPS steps long, so no two windows
   share a step of the busy-time median: each is an independent verdict. The first window
   (warm-up) is left out. Printed per case: windows that named the slowed rank, and that
   flagged it (score below the threshold) or flagged another rank; then the totals and the
   chance that naming a rank at random would do as well.
3. Healthy runs of --healthy-seconds (default 300) at 2 and 4 ranks: windows, rank-windows
   flagged (must be 0).

Run: ``.venv/bin/python benchmarks/bench_faults.py [--quick] [--healthy-seconds 300]``
(--quick: compute-slow and data-slow at 50% only, without the healthy runs).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the shared runner

from straggler_runs import coin_flip_chance, run_job

from fsdpmon.monitor.stats import BUSY_MIN_STEPS

WINDOWS = 4  # independent windows per run, after the warm-up one
STEPS = BUSY_MIN_STEPS * (WINDOWS + 1)


def calibrate(work: Path, nproc: int) -> float:
    run = run_job(work / f"calibrate{nproc}", nproc, None, 2 * BUSY_MIN_STEPS, BUSY_MIN_STEPS)
    print(f"  {nproc} ranks healthy: step {run.step_time_s * 1e3:.0f} ms "
          f"({run.seconds:.0f} s run)", flush=True)
    return run.step_time_s


def cases(quick: bool) -> list[tuple[int, int, str, float]]:
    """(ranks, slowed rank, kind, size): size is the factor or the share of a step."""
    sizes = (0.5,) if quick else (0.15, 0.5)
    out = []
    for nproc, rank in ((2, 0), (2, 1), (4, 2)):
        for share in sizes:
            out.append((nproc, rank, "compute-slow", 1 + share))
            out.append((nproc, rank, "data-slow", share))
    return out


def spec(kind: str, rank: int, size: float, step_s: float) -> str:
    if kind == "compute-slow":
        return f"compute-slow:rank={rank},factor={size:g}"
    return f"data-slow:rank={rank},seconds={size * step_s:.4f}"


def matrix(work: Path, quick: bool, step_s: dict[int, float]) -> None:
    totals = {2: [0, 0], 4: [0, 0]}  # named right, windows
    flagged_right = flagged_wrong = 0
    print(f"\nfault matrix ({STEPS} steps per run, windows of {BUSY_MIN_STEPS} steps):")
    print(f"  {'ranks':>5} {'rank':>4} {'fault':<34} {'neigh':<5} {'named':>7} "
          f"{'flagged':>7} {'wrong flag':>10} {'min score':>9}")
    for i, (nproc, rank, kind, size) in enumerate(cases(quick)):
        for busy in (False, True):
            fault = spec(kind, rank, size, step_s[nproc])
            run = run_job(work / f"case{i}-{int(busy)}", nproc, fault, STEPS, BUSY_MIN_STEPS,
                          busy_neighbour=busy)
            windows = run.windows[1:]
            named = sum(w.slowest_rank == rank for w in windows)
            right = sum(rank in w.flagged for w in windows)
            wrong = sum(len([r for r in w.flagged if r != rank]) for w in windows)
            low = min((w.scores[rank] for w in windows if w.scores[rank] is not None),
                      default=math.nan)
            totals[nproc][0] += named
            totals[nproc][1] += len(windows)
            flagged_right += right
            flagged_wrong += wrong
            print(f"  {nproc:>5} {rank:>4} {fault:<34} {'yes' if busy else 'no':<5} "
                  f"{named:>3}/{len(windows):<3} {right:>3}/{len(windows):<3} {wrong:>10} "
                  f"{low:>9.2f}", flush=True)
    for nproc, (named, n) in totals.items():
        if n:
            print(f"  {nproc} ranks: named the slowed rank in {named}/{n} windows "
                  f"({named / n:.0%}); a random pick does as well with chance "
                  f"{coin_flip_chance(n, named, nproc):.1e}")
    print(f"  windows that flagged the slowed rank: {flagged_right}; flags on another rank: "
          f"{flagged_wrong}")


def healthy(work: Path, seconds: float, step_s: dict[int, float]) -> None:
    print(f"\nhealthy runs of about {seconds:.0f} s (windows of {BUSY_MIN_STEPS} steps):")
    for nproc in (2, 4):
        steps = max(2 * BUSY_MIN_STEPS, int(seconds / step_s[nproc]))
        run = run_job(work / f"healthy{nproc}", nproc, None, steps, BUSY_MIN_STEPS,
                      timeout=seconds * 3 + 300)
        flags = sum(len(w.flagged) for w in run.windows)
        scores = [s for w in run.windows for s in w.scores.values() if s is not None]
        print(f"  {nproc} ranks: {steps} steps in {run.seconds:.0f} s, {len(run.windows)} "
              f"windows, rank-windows flagged: {flags}; scores {min(scores):.2f}.."
              f"{max(scores):.2f} (threshold below which a rank is flagged: 0.75)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="50%% slowdowns only, no healthy runs")
    p.add_argument("--healthy-seconds", type=float, default=300.0)
    p.add_argument("--only", choices=["matrix", "healthy"], default=None)
    args = p.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("calibration:")
        step_s = {n: calibrate(work, n) for n in (2, 4)}
        if args.only != "healthy":
            matrix(work, args.quick, step_s)
        if args.only != "matrix" and not args.quick:
            healthy(work, args.healthy_seconds, step_s)
    print(f"\n(took {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
