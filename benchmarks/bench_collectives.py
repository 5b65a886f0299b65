"""What the collective wrapper costs (fsdpmon.monitor.collectives: sequence number for the
/stacks evidence, wait time for straggler attribution), beside the two wrappers it replaced.

A one-process gloo group runs ``all_reduce`` of one float (the cheapest real collective, so the
wrapper's share is as large as it can get) in alternating blocks: unwrapped; the two pre-merge
wrappers stacked (benchmarks/premerge_collectives.py); the merged wrapper; each wrapped variant
both between steps (timer not armed: numbered only) and inside a step (armed: numbered and
timed). Prints the median per-call time of each and its difference from the unwrapped call. A
tiny FSDP2 CPU step makes a few dozen collective calls, so the per-step cost is that difference
times the calls per step (benchmarks/bench_monitor.py counts them).

    python benchmarks/bench_collectives.py [--calls 10000] [--blocks 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pre-merge reference

import premerge_collectives as premerge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10000, help="calls per block")
    parser.add_argument("--blocks", type=int, default=7, help="blocks of each kind")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    from fsdpmon.monitor import collectives
    from fsdpmon.monitor.collectives import CollectiveTimer

    merged_timer, old_timer = CollectiveTimer(), CollectiveTimer()
    collectives.activate(None)  # set below, without patching torch.distributed
    premerge.activate(old_timer)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            plain = dist.all_reduce
            merged = collectives.wrap("all_reduce", plain)
            stacked = premerge.stacked("all_reduce", plain)
            collectives._calls.timer = merged_timer
            variants: dict[str, tuple[Callable[..., Any], CollectiveTimer | None]] = {
                "plain": (plain, None),
                "two wrappers, between steps": (stacked, old_timer),
                "merged, between steps": (merged, merged_timer),
                "two wrappers, in a step": (stacked, old_timer),
                "merged, in a step": (merged, merged_timer),
            }
            tensor = torch.ones(1)
            times: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.blocks):
                for name, (fn, timer) in variants.items():
                    if timer is not None:
                        timer.armed = name.endswith("in a step")
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        fn(tensor)
                    times[name].append((time.perf_counter() - started) / args.calls)
                    if timer is not None:
                        timer.armed = False
                        timer.step_done()
                        timer.drain()
        finally:
            collectives._calls.timer = None
            dist.destroy_process_group()
    base = statistics.median(times["plain"]) * 1e6
    print(f"all_reduce(1 float), gloo, 1 process, median of {args.blocks} alternating blocks "
          f"of {args.calls} calls:")
    for name, samples in times.items():
        us = statistics.median(samples) * 1e6
        extra = "" if name == "plain" else f"  ({us - base:+.2f} us per call)"
        print(f"  {name:<28} {us:7.2f} us{extra}")
    print(f"merged wrapper: last entered {collectives.last_entered()}, "
          f"{merged_timer.calls} calls timed")


if __name__ == "__main__":
    main()
