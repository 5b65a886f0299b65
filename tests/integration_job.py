"""One example of examples/ run as a real 2-rank CPU job under torchrun, faults made from outside
(tests/outside_faults.py), watched the way `fsdpmon diagnose` watches (diagnose_job.Job). The
integration tests and benchmarks/bench_integrations.py share it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from diagnose_job import REPO, Job
from proc_tree import kill_tree
from support import free_port

EXAMPLES = {"fsdp1": "fsdp1_loop.py", "fsdp2": "fsdp2_loop.py",
            "lightning": "lightning_fsdp.py", "accelerate": "accelerate_fsdp.py"}
LOG_EVERY = 5
STALL_FLOOR_S = 4.0
# Rank 1's forward sleeps 9x its CPU time: its busy time then well over twice rank 0's, whose
# score (the median of two over its own) stays above 1 while rank 1's falls below 0.75.
SLOW_FACTOR = 10
FAULTS = f"compute-slow:rank=1,factor={SLOW_FACTOR};hang:rank=1,where=data"


@contextlib.contextmanager
def example_job(tmp: Path, library: str, steps: int = 3000, faults: str = FAULTS
                ) -> Iterator[Job]:
    """The example running (killed, with every child, on exit); faults gated (``open_gate``)."""
    port = free_port()
    (tmp / "gates").mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "FSDPMON_PORT": str(port),
           "FSDPMON_LISTEN_ADDRESS": "127.0.0.1", "FSDPMON_JOB_NAME": f"it-{library}",
           "FSDPMON_JSONL": str(tmp / "run.jsonl"), "FSDPMON_LOG_INTERVAL": str(LOG_EVERY),
           "FSDPMON_STALL_FLOOR_SECONDS": str(STALL_FLOOR_S),
           "FSDPMON_STATE_DIR": str(tmp / "state"), "FSDPMON_FAULT": faults,
           "FSDPMON_TEST_GATES": str(tmp / "gates")}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", str(REPO / "tests" / "outside_faults.py"),
            str(REPO / "examples" / EXAMPLES[library]), "--max-steps", str(steps)]
    with open(tmp / "train.log", "w") as out:
        train = subprocess.Popen(args, cwd=REPO, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    job = Job([f"127.0.0.1:{port}"], train, [], env, tmp)
    try:
        yield job
    finally:
        job.source.close()
        kill_tree(train)


def open_gate(job: Job, kind: str) -> None:
    (job.logs / "gates" / kind).touch()


def scored(snap) -> bool:
    """Both ranks serve a straggler score (their busy medians span BUSY_MIN_STEPS steps)."""
    return len([r for r in snap.ranks if r.straggler_score is not None]) == 2


def score_of(snap, rank: int) -> float | None:
    return next((r.straggler_score for r in snap.ranks if r.rank == rank), None)


def get(job: Job, path: str) -> str:
    with urllib.request.urlopen(f"http://{job.urls[0]}{path}", timeout=5) as resp:
        return resp.read().decode()


def records(job: Job, rank: int) -> list[dict]:
    lines = (job.logs / f"run.rank{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]


def tokens_per_second_check(steps: list[dict]) -> tuple[float, float, float]:
    """(served rate, JSONL rate, allowed relative error) over the windows after the first.

    Each window's rate is its tokens over the perf_counter time between two log-step
    measurements, so the served rates add up to Σ tokens / (m_n - m_1). The JSONL stamps each
    record at t_i = m_i + d_i, where d_i is that log step's own lag (the gather waiting for the
    peer, reading memory, building the record): the JSONL rate is Σ tokens / (t_n - t_1), and
    the two differ by (d_n - d_1) / (t_n - t_1) relatively. A log step's lag is under one step
    (the peer reaches the gather within the step both ranks just synchronised on), so the
    bound is the longest step over the span (a float's error is far below it)."""
    later = steps[1:]
    tokens = steps[-1]["tokens_total"] - steps[0]["tokens_total"]
    measured = sum((b["tokens_total"] - a["tokens_total"]) / b["tokens_per_second"]
                   for a, b in zip(steps, later, strict=False))
    span = steps[-1]["time"] - steps[0]["time"]
    bound = max(s["step_time_s"] for s in later) / span
    return tokens / measured, tokens / span, bound
