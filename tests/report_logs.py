"""Write run logs in the exact JSONL contract format (docs: contracts, "JSONL log format").

Used by the report's unit tests so they do not need a training run; the end-to-end test reads
logs the real trainer wrote.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_run(
    base: Path,
    world_size: int,
    *,
    log_steps: int = 8,
    log_every: int = 5,
    step_time_s: float = 0.2,
    tokens_per_step: int = 512,
    start: float = 1_700_000_000.0,
    device: str = "cpu",
    peak_flops: float | None = None,
    seed: int = 0,
) -> list[Path]:
    """One file per rank next to ``base`` (``x.jsonl`` -> ``x.rank<k>.jsonl``); their paths."""
    rng = random.Random(seed)
    paths = []
    for rank in range(world_size):
        path = base.with_name(f"{base.stem}.rank{rank}{base.suffix}")
        now, tokens = start, 0
        lines = [_header(rank, world_size, start, device, peak_flops)]
        for index in range(1, log_steps + 1):
            # the first window is slow (start-up), later ones jitter around step_time_s
            window = step_time_s * (3.0 if index == 1 else rng.uniform(0.9, 1.1))
            now += window * log_every
            tokens += tokens_per_step * log_every
            lines.append(_step(rank, world_size, index * log_every, now, tokens,
                               tokens_per_step / window, window, rng))
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        paths.append(path)
    return paths


def _header(rank: int, world_size: int, start: float, device: str, peak: float | None) -> dict:
    return {
        "kind": "run", "time": start, "rank": rank, "local_rank": rank,
        "world_size": world_size, "nodes": 1, "model": "tiny",
        "config": {"model": "tiny", "batch_size": 4, "seq_len": 128},
        "flops_per_token": 1.5e6, "device": device, "peak_flops": peak, "job_name": "test",
    }


def _step(rank, world_size, step, now, tokens, rate, window, rng) -> dict:
    record = {
        "kind": "step", "time": now, "rank": rank, "local_rank": rank,
        "world_size": world_size, "step": step, "loss": 5.0 - step * 0.01, "lr": 3e-4,
        "grad_norm": 1.0, "tokens_per_second": rate, "step_time_s": window,
        "data_wait_ratio": 0.01, "mfu": None,
        "peak_memory_bytes": 300_000_000 + rank * 1_000_000 + rng.randint(0, 1000),
        "tokens_total": tokens, "loss_nonfinite": False,
    }
    if rank == 0:
        record["job"] = {
            "step_time_min_s": window, "step_time_median_s": window, "step_time_max_s": window,
            "slowest_rank": 0, "peak_memory_max_bytes": 300_000_000, "peak_memory_max_rank": 0,
            "loss_mean": 5.0, "loss_max": 5.0,
        }
    return record


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
