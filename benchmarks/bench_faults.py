"""Does fsdpmon name the right straggler, and nobody on a healthy run? Prints; asserts nothing.

The trainer (tiny model, CPU, gloo) under torchrun, one fault per run from the fault grammar,
the monitor's windows read back from every rank's JSONL (tests/straggler_runs.py):

1. Calibration: a short healthy run per world size gives the busy time (a rank's own work per
   step, less its collective waits and its time waiting for a CPU) the data-slow sizes are set
   from, so that both faults add the same share to the slowed rank's own work: compute-slow
   factor 1.15 makes its forward and backward 15% longer, data-slow 15% adds 15% of the busy
   time to each of its batches. (A share of the step time would be far more: on a time-sliced
   4-rank job the step is mostly waiting, and 15% of it was 80% of a rank's busy time.)
2. The matrix: 2 ranks with rank 0 slowed, then rank 1; 4 ranks with rank 2 slowed; compute-slow
   (factor 1.15 and 1.5) and data-slow (15% and 50% of the busy time); each without and with a
   CPU-bound process beside the job. Windows are BUSY_MIN_STEPS steps long, so no two windows
   share a step of the busy-time median: each is an independent verdict. The first window
   (warm-up) is left out. Printed per case: windows that named the slowed rank (the lowest
   score: fsdpmon_job_slowest_rank), that scored it below the threshold, and that the monitor
   flagged it (fsdpmon_train_straggling: below the line in two disjoint medians, so never the
   first scored window) or flagged another rank; the slowed rank's median and lowest score,
   the other ranks' lowest, and the 1-minute load average; then the totals and the chance
   that naming a rank at random would do as well.
3. Healthy runs of --healthy-seconds (default 300) of wall time at 2 and 4 ranks: windows,
   rank-windows the monitor flagged (must be 0), and those one window's score alone put below
   the line (what a flag without persistence would have raised).

Run: ``.venv/bin/python benchmarks/bench_faults.py [--quick] [--healthy-seconds 300]``
(--quick: compute-slow and data-slow at 50% only, without the healthy runs).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the shared runner

from straggler_runs import JobRun, coin_flip_chance, run_for, run_job

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.monitor.stats import BUSY_MIN_STEPS

WINDOWS = 4  # independent windows per run, after the warm-up one
STEPS = BUSY_MIN_STEPS * (WINDOWS + 1)


def calibrate(work: Path, nproc: int) -> JobRun:
    run = run_job(work / f"calibrate{nproc}", nproc, None, 2 * BUSY_MIN_STEPS, BUSY_MIN_STEPS)
    print(f"  {nproc} ranks healthy: step {run.step_time_s * 1e3:.0f} ms, busy "
          f"{run.busy_s * 1e3:.1f} ms, waiting for a CPU {run.descheduled_ratio:.0%} of the step "
          f"({run.seconds:.0f} s run)", flush=True)
    return run


def cases(quick: bool) -> list[tuple[int, int, str, float]]:
    """(ranks, slowed rank, kind, size): size is the factor or the share of a step."""
    sizes = (0.5,) if quick else (0.15, 0.5)
    out = []
    for nproc, rank in ((2, 0), (2, 1), (4, 2)):
        for share in sizes:
            out.append((nproc, rank, "compute-slow", 1 + share))
            out.append((nproc, rank, "data-slow", share))
    return out


def spec(kind: str, rank: int, size: float, busy_s: float) -> str:
    if kind == "compute-slow":
        return f"compute-slow:rank={rank},factor={size:g}"
    return f"data-slow:rank={rank},seconds={size * busy_s:.4f}"


def matrix(work: Path, quick: bool, calibrated: dict[int, JobRun]) -> None:
    totals = {2: [0, 0], 4: [0, 0]}  # named right, windows
    flagged_right = flagged_wrong = 0
    print(f"\nfault matrix ({STEPS} steps per run, windows of {BUSY_MIN_STEPS} steps):")
    print(f"  {'ranks':>5} {'rank':>4} {'fault':<34} {'neigh':<5} {'named':>7} "
          f"{'below':>7} {'flagged':>7} {'wrong flag':>10} {'score med':>9} {'min':>5} "
          f"{'others min':>10} {'load':>5}")
    for i, (nproc, rank, kind, size) in enumerate(cases(quick)):
        for busy in (False, True):
            fault = spec(kind, rank, size, calibrated[nproc].busy_s)
            run = run_job(work / f"case{i}-{int(busy)}", nproc, fault, STEPS, BUSY_MIN_STEPS,
                          busy_neighbour=busy)
            windows = run.windows[1:]
            named = sum(w.slowest_rank == rank for w in windows)
            right = sum(rank in w.flagged for w in windows)
            wrong = sum(len([r for r in w.flagged if r != rank]) for w in windows)
            below = sum(rank in w.low for w in windows)
            own = [s for w in windows if (s := w.scores[rank]) is not None]
            low = min(own, default=math.nan)
            mid = statistics.median(own) if own else math.nan
            others = min((s for w in windows for r, s in w.scores.items()
                          if r != rank and s is not None), default=math.nan)
            totals[nproc][0] += named
            totals[nproc][1] += len(windows)
            flagged_right += right
            flagged_wrong += wrong
            print(f"  {nproc:>5} {rank:>4} {fault:<34} {'yes' if busy else 'no':<5} "
                  f"{named:>3}/{len(windows):<3} {below:>3}/{len(windows):<3} "
                  f"{right:>3}/{len(windows):<3} {wrong:>10} "
                  f"{mid:>9.2f} {low:>5.2f} {others:>10.2f} {os.getloadavg()[0]:>5.1f}",
                  flush=True)
    for nproc, (named, n) in totals.items():
        if n:
            print(f"  {nproc} ranks: named the slowed rank in {named}/{n} windows "
                  f"({named / n:.0%}); a random pick does as well with chance "
                  f"{coin_flip_chance(n, named, nproc):.1e}")
    print(f"  windows that flagged the slowed rank: {flagged_right}; flags on another rank: "
          f"{flagged_wrong}")


def healthy(work: Path, seconds: float) -> None:
    print(f"\nhealthy runs of {seconds:.0f} s (windows of {BUSY_MIN_STEPS} steps):")
    for nproc in (2, 4):
        run = run_for(work / f"healthy{nproc}", nproc, seconds, BUSY_MIN_STEPS)
        flags = sum(len(w.flagged) for w in run.windows)
        low = sum(len(w.low) for w in run.windows)
        scored = sum(s is not None for w in run.windows for s in w.scores.values())
        scores = [s for w in run.windows for s in w.scores.values() if s is not None]
        slowest = Counter(w.slowest_rank for w in run.windows)
        print(f"  {nproc} ranks: {run.windows[-1].step} steps in {run.seconds:.0f} s, "
              f"{len(run.windows)} windows; rank-windows flagged by the monitor: {flags} of "
              f"{scored} scored; scored below {STRAGGLER_SCORE_THRESHOLD} in one window: {low}; "
              f"scores {min(scores):.2f}..{max(scores):.2f}; slowest rank by window "
              f"{dict(sorted(slowest.items()))}; waiting for a CPU "
              f"{run.descheduled_ratio:.0%} of the step; load {os.getloadavg()[0]:.1f}",
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="50%% slowdowns only, no healthy runs")
    p.add_argument("--healthy-seconds", type=float, default=300.0)
    p.add_argument("--only", choices=["matrix", "healthy"], default=None)
    args = p.parse_args()
    started = time.monotonic()
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
          " (1, 5, 15 min)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("calibration:")
        calibrated = {n: calibrate(work, n) for n in (2, 4)}
        if args.only != "healthy":
            matrix(work, args.quick, calibrated)
        if args.only != "matrix" and not args.quick:
            healthy(work, args.healthy_seconds)
    print(f"\n(took {time.monotonic() - started:.0f} s; load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
