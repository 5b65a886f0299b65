"""Benchmark `fsdpmon report`'s log reading: how long a scaling study over big logs takes.

Writes JSONL logs in the contract format (the monitor's record shape, phase times and rank 0's
job summary included) for runs of several sizes, then times, median over rounds:

- load: streaming and parsing every rank's file into samples (records per second);
- stats: the figures (throughput, percentiles, memory) over the loaded samples;
- the whole command, `fsdpmon report DIR --out OUT` in-process (chart and files included);
- peak memory of the process afterwards (ru_maxrss).

Usage: .venv/bin/python benchmarks/bench_report.py [--rounds 3] [--records 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from fsdpmon.report.cli import configure, run
from fsdpmon.report.loader import load_runs
from fsdpmon.report.stats import run_stats, with_scaling

WORLD_SIZES = (1, 8, 32)


def write_logs(root: Path, world_size: int, records: int, seed: int) -> int:
    """One run's per-rank files; returns the bytes written."""
    rng = random.Random(seed)
    size = 0
    for rank in range(world_size):
        header = {"kind": "run", "time": 1.7e9, "rank": rank, "local_rank": rank % 8,
                  "world_size": world_size, "nodes": max(1, world_size // 8), "model": "llama2-7b",
                  "config": {"batch_size": 4, "seq_len": 4096}, "flops_per_token": 4.2e10,
                  "device": "NVIDIA H100 80GB HBM3", "peak_flops": 989e12, "job_name": "bench"}
        lines = [json.dumps(header)]
        now, tokens = 1.7e9, 0
        for index in range(1, records + 1):
            window = rng.uniform(1.9, 2.1)
            now += window * 10
            tokens += 10 * 16384
            record = {
                "kind": "step", "time": now, "rank": rank, "local_rank": rank % 8,
                "world_size": world_size, "step": index * 10, "loss": 2.0, "lr": 3e-4,
                "grad_norm": 1.0, "tokens_per_second": 16384 / window, "step_time_s": window,
                "data_wait_ratio": 0.01, "mfu": 0.4, "peak_memory_bytes": 6.1e10,
                "tokens_total": tokens, "loss_nonfinite": False,
                "phase_seconds": {"data": 0.01, "forward": 0.6, "backward": 1.2,
                                  "optimizer": 0.2},
            }
            if rank == 0:
                record["job"] = {"step_time_min_s": window, "step_time_median_s": window,
                                 "step_time_max_s": window, "slowest_rank": 3,
                                 "peak_memory_max_bytes": 6.2e10, "peak_memory_max_rank": 5,
                                 "loss_mean": 2.0, "loss_max": 2.1}
            lines.append(json.dumps(record))
        text = "\n".join(lines) + "\n"
        (root / f"n{world_size}.rank{rank}.jsonl").write_text(text)
        size += len(text)
    return size


def timed(fn, *args):
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def figures(runs):
    return with_scaling([run_stats(r) for r in runs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=2000, help="log records per rank")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp) / "runs"
        root.mkdir()
        size = sum(write_logs(root, w, opts.records, seed=w) for w in WORLD_SIZES)
        records = sum(WORLD_SIZES) * (opts.records + 1)
        loads, stats, whole = [], [], []
        command = argparse.ArgumentParser()
        configure(command)
        ns = command.parse_args([str(root), "--out", str(Path(tmp) / "out")])
        for _ in range(opts.rounds):
            seconds, runs = timed(load_runs, [str(root)])
            loads.append(seconds)
            stats.append(timed(figures, runs)[0])
            with contextlib.redirect_stdout(io.StringIO()):
                whole.append(timed(run, ns)[0])
    load_s = statistics.median(loads)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, "
          f"python {platform.python_version()}")
    print(f"logs: runs of {', '.join(map(str, WORLD_SIZES))} ranks x {opts.records} records: "
          f"{records:,} records, {size / 1e6:.1f} MB")
    print(f"load   median {load_s:.2f} s  ({records / load_s:,.0f} records/s)")
    print(f"stats  median {statistics.median(stats) * 1000:.1f} ms")
    print(f"report median {statistics.median(whole):.2f} s (load + stats + chart + files)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
