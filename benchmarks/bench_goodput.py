"""Goodput against the truth, one fault at a time: each badput category as `fsdpmon goodput`
measures it from the run's files, next to the truth taken from outside the monitor (the
workers' start times, the console's step lines timestamped as they arrive, the signals' own
times, the faults' sizes; tests/goodput_scenario.py), and the incidents `fsdpmon incidents`
names from the same files.

    python benchmarks/bench_goodput.py                  # healthy, data, hang, save, kill, all
    python benchmarks/bench_goodput.py --only hang kill

Each run is a 2-rank CPU job (torchrun, gloo, the tiny model, 45 steps, checkpoints every 10).
Tolerance: 5% of the truth or 1 s, whichever is larger (the issue's bound); the parts must sum
to the wall within 1%. Not a timed test: it prints what it measured and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from goodput_scenario import Scenario, run, tolerance, truth  # noqa: E402

from fsdpmon.incidents.incidents import incidents  # noqa: E402
from fsdpmon.job.run_goodput import goodput  # noqa: E402
from fsdpmon.job.runlog import load_run  # noqa: E402

NONE = {"data_rank": None, "stop_rank": None, "save_rank": None, "kill_rank": None}
SCENARIOS = {
    "healthy": Scenario(**NONE),
    "data": Scenario(**{**NONE, "data_rank": 1}),
    "hang": Scenario(**{**NONE, "stop_rank": 1}),
    "save": Scenario(**{**NONE, "save_rank": 1}),
    "kill": Scenario(**{**NONE, "kill_rank": 0}),
    "all": Scenario(),
}


def report(name: str, sc: Scenario, workdir: Path) -> bool:
    began = time.monotonic()
    seen = run(sc, workdir)
    took = time.monotonic() - began
    if seen.code != 0:
        print(f"{name}: the job failed ({seen.code}):\n" + "".join(seen.output[-20:]))
        return False
    known = truth(sc, seen)
    log = load_run(workdir / "logs")
    gp = goodput(log)
    bad = gp.badput_seconds
    measured = {**bad, "wall_seconds": gp.wall_seconds,
                "restart+restore": bad["restart"] + bad["checkpoint_restore"]}
    print(f"\n== {name} ({took:.0f} s to run) ==")
    print(f"  {'category':<18} {'measured':>9} {'truth':>9} {'off':>7} {'allowed':>8}")
    ok = True
    for key, expected in known.items():
        off = measured[key] - expected
        good = abs(off) <= tolerance(expected)
        ok &= good
        print(f"  {key:<18} {measured[key]:>9.2f} {expected:>9.2f} {off:>+7.2f} "
              f"{tolerance(expected):>8.2f} {'' if good else ' OUT'}")
    parts = gp.productive_seconds + sum(bad.values())
    summed = abs(parts - gp.wall_seconds) <= 0.01 * gp.wall_seconds
    ok &= summed
    ratio = gp.goodput_ratio or 0.0
    rest = gp.wall_seconds - bad["startup"] - bad["checkpoint_save"]
    print(f"  parts {parts:.2f} s vs wall {gp.wall_seconds:.2f} s: "
          f"{'sum within 1%' if summed else 'OUT'}; goodput {ratio:.1%}; of the wall less "
          f"startup and saves: {gp.productive_seconds / rest if rest > 0 else 0.0:.1%}")
    for inc in incidents(log, gp):
        print(f"  incident: {inc.cause:<18} rank {inc.rank}  node {inc.node or '-'}  "
              f"lost {inc.lost_gpu_seconds:.1f} GPU-s")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    ok = True
    for name in args.only:
        with tempfile.TemporaryDirectory(prefix=f"goodput-{name}-") as tmp:
            ok &= report(name, SCENARIOS[name], Path(tmp))
    print(f"\nload at the end {os.getloadavg()[0]:.1f}; "
          + ("every category within its bound" if ok else "SOME CATEGORY OUT OF BOUNDS"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
