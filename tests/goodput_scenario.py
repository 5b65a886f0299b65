"""One 2-rank CPU training run with faults whose cost the test knows from outside, for the
goodput and incidents proofs (tests/test_e2e_goodput.py).

Faults, each optional, in this order:
- data-slow: rank ``data_rank``'s loader ``data_s`` slower for steps ``data_steps`` (the
  injector, with an end);
- a hang that ends: the test SIGSTOPs rank ``stop_rank`` once it sees step ``stop_at`` and
  SIGCONTs it ``stop_s`` seconds later (from outside);
- a slow checkpoint: rank ``save_rank``'s saves from step ``save_from`` ``save_s`` longer;
- a SIGKILL at step ``kill_at``: every rank holds still after that step (the pause fault), the
  test SIGKILLs rank ``kill_rank``; torchrun restarts the group, which resumes from the last
  checkpoint (every ``every`` steps).

Truth comes from outside the monitor: the workers' start times (psutil), the console's step
lines timestamped by this process as they arrive, the signals' own times, the fault's sizes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from proc_tree import kill_tree
from prometheus_stack import wait_for
from trainer_launch import REPO, child_env, torchrun_args

STEP_LINE = re.compile(r"^step (\d+)/(\d+) ")
STALL_FLOOR_S = 3  # above a slowed save (save_s + a healthy save), below the hang


@dataclass
class Scenario:
    steps: int = 45
    every: int = 10
    data_rank: int | None = 0
    data_s: float = 0.25
    data_steps: tuple[int, int] = (4, 19)
    stop_rank: int | None = 1
    stop_at: int = 22
    stop_s: float = 6.0
    save_rank: int | None = 0
    save_s: float = 1.5
    # after the stop: rank 1 waits out rank 0's slowed save in its next collective, and the
    # stall bound inside a collective is 3 x the longest wait seen before (stall_bound), so a
    # slowed save before the stop would lift rank 0's bound to ~3 x save_s, near stop_s
    save_from: int = 30
    kill_rank: int | None = 1
    kill_at: int = 37
    job: str = "goodput-e2e"
    port: int = 0

    def faults(self, pause_dir: Path) -> str:
        out = []
        if self.data_rank is not None:
            a, b = self.data_steps
            out.append(f"data-slow:rank={self.data_rank},seconds={self.data_s},from_step={a},"
                       f"until_step={b}")
        if self.save_rank is not None:
            out.append(f"checkpoint-slow:rank={self.save_rank},seconds={self.save_s},"
                       f"from_step={self.save_from}")
        if self.kill_rank is not None:
            out.append(f"pause:at_step={self.kill_at},dir={pause_dir}")
        return ";".join(out)


@dataclass
class Observed:
    """What the test saw from outside."""

    worker_start: float = 0.0
    lines: list[tuple[float, int]] = field(default_factory=list)  # (arrival, step)
    stopped: tuple[float, float] | None = None  # SIGSTOP, SIGCONT times
    killed_at: float | None = None
    output: list[str] = field(default_factory=list)
    code: int | None = None


def _reader(proc: subprocess.Popen, seen: Observed, on_step: Any) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        now = time.time()
        line = raw.decode(errors="replace")
        seen.output.append(line)
        match = STEP_LINE.match(line)
        if match:
            seen.lines.append((now, int(match[1])))
            on_step(int(match[1]))


def _workers(proc: subprocess.Popen) -> dict[int, psutil.Process]:
    out = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rank = child.environ().get("RANK")
            if rank is not None and "fsdpmon.trainer.train" in " ".join(child.cmdline()):
                out[int(rank)] = child
    return out


def _alive(proc: subprocess.Popen, seen: Observed, check: Any) -> Any:
    """``check`` for wait_for, failing at once (with the output) when the job has ended."""
    def checked() -> Any:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended ({proc.returncode}) early:\n"
                                 + "".join(seen.output[-40:]))
        return check()
    return checked


def run(sc: Scenario, workdir: Path, timeout: float = 120.0) -> Observed:
    """Run the scenario to its end; its JSONL in ``workdir/logs``."""
    pause_dir = workdir / "pause"
    pause_dir.mkdir(parents=True, exist_ok=True)
    args = torchrun_args(2, ["-m", "fsdpmon.trainer.train", "--model", "tiny", "--max-steps",
                             str(sc.steps), "--batch-size", "2", "--seq-len", "32",
                             "--log-every", "1", "--checkpoint-dir", str(workdir / "ckpt"),
                             "--checkpoint-every", str(sc.every), "--keep-checkpoints", "2",
                             "--log-jsonl", str(workdir / "logs" / "run.jsonl"),
                             "--metrics-port", str(sc.port), "--job-name", sc.job],
                         max_restarts=1 if sc.kill_rank is not None else 0)
    env = child_env(FSDPMON_STALL_FLOOR_SECONDS=str(STALL_FLOOR_S), NODE_NAME="node-a",
                    FSDPMON_STATE_DIR=str(workdir / "state"), FSDPMON_LISTEN_ADDRESS="127.0.0.1",
                    FSDPMON_FAULT=sc.faults(pause_dir))
    seen = Observed()
    stop_now = threading.Event()
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        workers = wait_for("both workers started", lambda: (w := _workers(proc)) and len(
            w) == 2 and w, timeout=60, every=0.05)
        seen.worker_start = min(w.create_time() for w in workers.values())

        def on_step(step: int) -> None:
            if sc.stop_rank is not None and step == sc.stop_at and seen.stopped is None:
                stop_now.set()

        reader = threading.Thread(target=_reader, args=(proc, seen, on_step), daemon=True)
        reader.start()
        if sc.stop_rank is not None:
            wait_for(f"step {sc.stop_at}", _alive(proc, seen, stop_now.is_set), timeout=timeout,
                     every=0.02)
            pid = workers[sc.stop_rank].pid
            began = time.time()
            os.kill(pid, signal.SIGSTOP)
            time.sleep(sc.stop_s)  # the fault itself: a hang of known length
            os.kill(pid, signal.SIGCONT)
            seen.stopped = (began, time.time())
        if sc.kill_rank is not None:
            note = pause_dir / f"pause.rank{sc.kill_rank}"
            wait_for(f"the pause at step {sc.kill_at}", _alive(proc, seen, note.exists),
                     timeout=timeout, every=0.02)
            pid = int(wait_for("the pause note's pid", lambda: note.read_text().strip(),
                               timeout=5, every=0.02))
            os.kill(pid, signal.SIGKILL)
            seen.killed_at = time.time()
        seen.code = proc.wait(timeout=timeout)
        reader.join(timeout=10)
    finally:
        kill_tree(proc)
    return seen


def typical_step(seen: Observed) -> float:
    """The median time between consecutive step lines (most steps are healthy)."""
    gaps = [b[0] - a[0] for a, b in zip(seen.lines, seen.lines[1:], strict=False)
            if b[1] == a[1] + 1]
    return statistics.median(gaps)


def line_time(seen: Observed, step: int, which: int = 0) -> float:
    """When the ``which``-th line of ``step`` arrived (a restart makes some steps twice)."""
    return [t for t, s in seen.lines if s == step][which]


def truth(sc: Scenario, seen: Observed) -> dict[str, float]:
    """Each badput category as the test knows it from outside."""
    step = typical_step(seen)
    last = seen.lines[-1][0]
    out = {"wall_seconds": last - seen.worker_start,
           "startup": line_time(seen, 1) - step - seen.worker_start,
           "data_wait": 0.0, "checkpoint_save": 0.0, "stall": 0.0, "straggler_wait": 0.0,
           "restart+restore": 0.0, "recompute": 0.0, "unaccounted": 0.0}
    if sc.data_rank is not None:
        a, b = sc.data_steps
        out["data_wait"] = (b - a + 1) * sc.data_s
    if seen.stopped is not None:
        out["stall"] = seen.stopped[1] - seen.stopped[0]
    # a save after step s lengthens the gap between the lines of s and s + 1; the next gap is
    # that step's own length (a data-slow step is slow on both sides)
    out["checkpoint_save"] = sum(
        2 * line_time(seen, s + 1) - line_time(seen, s) - line_time(seen, s + 2)
        for s in range(sc.every, sc.steps - 1, sc.every))
    if sc.kill_rank is not None:
        resumed = sc.kill_at // sc.every * sc.every
        out["recompute"] = (sc.kill_at - resumed) * step
        first_after = line_time(seen, resumed + 1, 1)
        out["restart+restore"] = first_after - step - line_time(seen, sc.kill_at)
    return out


def data_wait_after(sc: Scenario, seen: Observed, since: float) -> float:
    """The slowed loader's seconds in steps whose lines came after ``since``: what a counter
    first sampled at ``since`` can still show (``increase()`` counts from the first sample)."""
    a, b = sc.data_steps
    return sc.data_s * sum(1 for s in range(a, b + 1) if line_time(seen, s) > since)


def tolerance(value: float) -> float:
    """The issue's bound: 5% of the truth or 1 s, whichever is larger."""
    return max(0.05 * abs(value), 1.0)
