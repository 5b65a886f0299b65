"""Benchmark shutdown: stop a real 2-rank job every way issue 52 lists, many rounds, and count
what outlives it.

Each round (tests/shutdown_job.py) starts torchrun with 2 CPU ranks of the bundled trainer on
one port (the port every earlier round used: a round that gets served shows the port came
back), stops it, and within 10 s of the stop expects no process of the job (the pod's server
included), the port free, and nothing under /dev/shm but a killed rank's exit records. The
stops: SIGTERM to the process group twice within 10 ms; SIGTERM then SIGINT; SIGTERM during
start-up, before the first step; SIGKILL of one rank then SIGTERM to the rest; SIGKILL of the
pod's server during a scrape then SIGTERM; the normal end of a short run.

Prints, per stop: rounds, leftovers (must be 0) and the slowest exit (seconds from the stop, or
from the job's own end, to nothing left); then the wall time of one round. Exit status 1 when
anything was left. Not a test: figures depend on the machine and its load.
Run `python benchmarks/bench_shutdown.py [--rounds N] [--stops a,b]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from shutdown_job import STOPS, one_round  # noqa: E402
from support import free_port  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=100, help="rounds of each stop (default 100)")
    p.add_argument("--stops", default=",".join(STOPS), help=f"which stops (default: all of "
                   f"{','.join(STOPS)})")
    args = p.parse_args(argv)
    args.stops = [s for s in args.stops.split(",") if s]
    unknown = sorted(set(args.stops) - set(STOPS))
    if unknown or not args.stops or args.rounds < 1:
        p.error(f"--stops: unknown {unknown} (known: {','.join(STOPS)})" if unknown
                else "--rounds must be at least 1 and --stops name one stop")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    port = free_port()
    rows: dict[str, list] = {stop: [] for stop in args.stops}
    took: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-shutdown-") as work:
        for n in range(args.rounds):
            for stop in args.stops:  # interleaved: load drifts over the run, alike for all
                began = time.monotonic()
                result = one_round(stop, port, Path(work))
                took.append(time.monotonic() - began)
                rows[stop].append(result)
                mark = "" if not result.leftovers else f"  LEFT: {result.leftovers}"
                print(f"round {n + 1} {stop}: {result.seconds_to_exit:.2f} s{mark}",
                      flush=True)
    print(f"\n{'stop':<24}{'rounds':>7}{'leftovers':>10}{'slowest exit s':>16}")
    left = 0
    for stop, results in rows.items():
        bad = sum(1 for r in results if r.leftovers)
        left += bad
        slowest = max(r.seconds_to_exit for r in results)
        print(f"{stop:<24}{len(results):>7}{bad:>10}{slowest:>16.2f}")
    print(f"\none round (start, stop, check): mean {sum(took) / len(took):.1f} s, max "
          f"{max(took):.1f} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
