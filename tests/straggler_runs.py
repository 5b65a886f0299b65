"""Run the real trainer under torchrun with a fault spec (or none), optionally with a CPU-bound
process beside it, and read back what each log window named: the slowest rank, every rank's
straggler score, the ranks whose score was below the threshold, and the ranks the monitor
flagged (its persistent verdict, fsdpmon.monitor.straggling).

Shared by tests/test_e2e_straggler.py (a compact subset) and benchmarks/bench_faults.py (the
full matrix and the long healthy runs).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from proc_tree import kill_tree
from trainer_launch import REPO, child_env, launched, run, torchrun_args

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.faultspec import ENV_VAR as FAULT_ENV

# A busy loop: one core's worth of CPU taken from the job, as a noisy neighbour would.
BUSY_LOOP = "import time\nwhile True:\n    time.perf_counter()\n"


@dataclass(frozen=True)
class Window:
    step: int
    slowest_rank: int
    scores: dict[int, float | None]
    straggling: dict[int, bool]  # the monitor's flag per rank

    @property
    def flagged(self) -> list[int]:
        """Ranks the monitor flagged as stragglers in this window (what top and the gauge
        show)."""
        return [r for r, flag in self.straggling.items() if flag]

    @property
    def low(self) -> list[int]:
        """Ranks whose score of this window alone was below the line."""
        return [r for r, s in self.scores.items()
                if s is not None and s < STRAGGLER_SCORE_THRESHOLD]


@dataclass(frozen=True)
class JobRun:
    windows: list[Window]
    seconds: float
    step_time_s: float  # median over windows of rank 0's mean step time
    busy_s: float  # median over every rank's scored windows of its busy time
    descheduled_ratio: float  # median over every rank's windows: share of step waiting for a CPU

    def after(self, step: int) -> list[Window]:
        """Windows that only hold steps after ``step``."""
        return [w for w in self.windows if w.step - self.log_every >= step]

    log_every: int = 10


@contextlib.contextmanager
def neighbour(active: bool) -> Iterator[None]:
    """A CPU-bound process beside the job while the block runs (or nothing)."""
    if not active:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True)
    try:
        yield
    finally:
        kill_tree(proc)


def _trainer_args(workdir: Path, nproc: int, steps: int, log_every: int,
                  seq_len: int) -> list[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    return torchrun_args(nproc, ["-m", "fsdpmon.trainer.train", "--model", "tiny",
                                 "--max-steps", str(steps), "--log-every", str(log_every),
                                 "--seq-len", str(seq_len), "--metrics-port", "0",
                                 "--log-jsonl", str(workdir / "log.jsonl")])


def run_job(workdir: Path, nproc: int, fault: str | None, steps: int, log_every: int,
            busy_neighbour: bool = False, seq_len: int = 64, timeout: float = 600) -> JobRun:
    """Train ``steps`` tiny steps on ``nproc`` CPU ranks; the windows the monitor logged."""
    args = _trainer_args(workdir, nproc, steps, log_every, seq_len)
    env = {FAULT_ENV: fault} if fault else {}
    started = time.monotonic()
    with neighbour(busy_neighbour):
        code, out = run(args, workdir / "out.txt", timeout=timeout, **env)
    seconds = time.monotonic() - started
    assert code == 0, out[-3000:]
    return read_windows(workdir, nproc, log_every, seconds)


def run_for(workdir: Path, nproc: int, seconds: float, log_every: int,
            seq_len: int = 64) -> JobRun:
    """Train on ``nproc`` CPU ranks for ``seconds`` of wall time (a step count from a
    calibrated step time falls short when the load changes), then kill the job's process
    tree; the windows every rank logged until then."""
    args = _trainer_args(workdir, nproc, 10**9, log_every, seq_len)
    started = time.monotonic()
    with launched(args, child_env(), workdir / "out.txt") as proc:
        try:
            code = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            code = None  # still training, as it should be
        assert code is None, (f"the job ended on its own (exit {code}) after "
                              f"{time.monotonic() - started:.0f} of {seconds:.0f} s:\n"
                              f"{(workdir / 'out.txt').read_text()[-3000:]}")
    return read_windows(workdir, nproc, log_every, time.monotonic() - started)


def read_windows(workdir: Path, nproc: int, log_every: int, seconds: float) -> JobRun:
    records = {r: _records(workdir / f"log.rank{r}.jsonl") for r in range(nproc)}
    steps = {r: {x["step"]: x for x in recs if x["kind"] == "step"} for r, recs in records.items()}
    windows = []
    for step, rec0 in sorted(steps[0].items()):
        if any(step not in steps[r] for r in range(nproc)):
            continue  # the job was stopped while the ranks wrote this window
        scores = {r: steps[r][step].get("straggler_score") for r in range(nproc)}
        flags = {r: bool(steps[r][step].get("straggling")) for r in range(nproc)}
        windows.append(Window(step, rec0["job"]["slowest_rank"], scores, flags))
    times = [x["step_time_s"] for x in steps[0].values()]
    busy = [x["busy_s"] for r in steps.values() for x in r.values() if x["busy_s"] is not None]
    off_cpu = [x.get("descheduled_ratio") for r in steps.values() for x in r.values()]
    return JobRun(windows, seconds, _median(times), _median(busy),
                  _median([x for x in off_cpu if x is not None]), log_every)


def _records(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    out = [json.loads(line) for line in lines[:-1]]
    with contextlib.suppress(json.JSONDecodeError, IndexError):
        out.append(json.loads(lines[-1]))  # the last line may be torn by the stop
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def coin_flip_chance(n: int, k: int, ranks: int) -> float:
    """Chance that naming a rank at random names the right one in at least k of n windows."""
    p = 1.0 / ranks
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


__all__ = ["REPO", "JobRun", "Window", "coin_flip_chance", "neighbour", "run_for", "run_job"]
