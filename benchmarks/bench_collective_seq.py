"""What counting collectives costs (fsdpmon.monitor.collective_seq, the /stacks evidence).

A one-process gloo group runs ``all_reduce`` of one float (the cheapest real collective, so the
wrapper's share is as large as it can get) in alternating blocks, unwrapped and wrapped, and
prints the per-call times and their difference. A tiny FSDP2 CPU step makes a few dozen
collective calls, so the per-step cost is that difference times the calls per step.

    python benchmarks/bench_collective_seq.py [--calls 20000] [--blocks 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per block")
    parser.add_argument("--blocks", type=int, default=10, help="blocks of each kind")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from fsdpmon.monitor import collective_seq

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            plain = dist.all_reduce
            collective_seq.install()
            wrapped = dist.all_reduce
            assert wrapped is not plain and c10d.all_reduce is not plain
            tensor = torch.ones(1)
            times: dict[str, list[float]] = {"plain": [], "counted": []}
            for _ in range(args.blocks):
                for name, fn in (("plain", plain), ("counted", wrapped)):
                    started = time.perf_counter()
                    for _ in range(args.calls):
                        fn(tensor)
                    times[name].append((time.perf_counter() - started) / args.calls)
        finally:
            dist.destroy_process_group()
    plain_us = statistics.median(times["plain"]) * 1e6
    counted_us = statistics.median(times["counted"]) * 1e6
    print(f"all_reduce(1 float), gloo, 1 process: {plain_us:.2f} us plain, {counted_us:.2f} us "
          f"counted (median of {args.blocks} alternating blocks of {args.calls} calls)")
    print(f"counting costs {counted_us - plain_us:+.2f} us per collective call; "
          f"last entered: {collective_seq.last_entered()}")


if __name__ == "__main__":
    main()
