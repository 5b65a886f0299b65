"""bench_diagnose's healthy runs: one time-bound healthy job watched three ways at once.

- `fsdpmon diagnose`'s engine (TargetsSource + Diagnoser, as the CLI runs it) every ~0.5 s:
  the findings it raised;
- a real Prometheus loaded with the shipped rules exactly as generated (tests/shipped_alerts.py):
  every alert that went pending or firing since it started, before the job's first step;
- the monitor's straggler verdict in every rank's JSONL (tests/straggler_runs.py), every window
  of the run: rank-windows flagged (``straggling``), one-window scores below the line, the
  lowest score.

The job (tests/diagnose_job.py: torchrun CPU ranks of the tiny trainer, the exporter with
simulated GPUs) trains until it is killed; the watch lasts ``seconds`` of wall time from the
moment every rank steps and the exporter's GPUs are tied to them.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from diagnose_job import faulty_job, stepping
from shipped_alerts import EVAL_INTERVAL_S, TRAINING_SCRAPE, shipped_alerting
from straggler_runs import read_windows

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.monitor.stats import BUSY_MIN_STEPS

HEALTHY_CKPT_EVERY = 50  # healthy runs save too: cheap saves must not be checkpoint_slow
HEALTHY_LOG_EVERY = 5  # faulty_job's log window: a straggler score every 5 steps
# Start-up (torchrun, every rank stepping) takes 15-40 s on a loaded 2-core host. A job whose
# port another process took between free_port() and the monitor's bind (seen once on this
# shared host) never shows its ranks; it is started again on fresh ports.
START_TIMEOUT_S = 150
ATTEMPTS = 2


def _started(work: Path, ranks: int, stack: contextlib.ExitStack):
    work.mkdir(parents=True)
    extra = ("--checkpoint-every", str(HEALTHY_CKPT_EVERY), "--checkpoint-dir",
             str(work / "ckpt"), "--log-jsonl", str(work / "log.jsonl"))
    job = stack.enter_context(faulty_job(work, ranks, "", extra))
    watch = stack.enter_context(shipped_alerting(work / "prom", *job.urls))
    job.wait("stepping", stepping(ranks), START_TIMEOUT_S)
    job.start_exporter()
    job.wait("GPUs tied", stepping(ranks, gpus=True), 120)
    return job, watch


def run_healthy(ranks: int, seconds: float, keep: Path | None = None) -> list[str]:
    """The report's lines for one healthy run. With ``keep``, the run's files (JSONL,
    Prometheus' TSDB, logs) stay in keep/healthy<ranks>."""
    where = keep / f"healthy{ranks}" if keep else None
    if where:
        where.mkdir(parents=True, exist_ok=False)
    notes: list[str] = []
    with contextlib.nullcontext(where) if where else tempfile.TemporaryDirectory() as tmp:
        for attempt in range(1, ATTEMPTS + 1):
            work = Path(tmp) / f"try{attempt}"
            stack = contextlib.ExitStack()
            try:
                job, watch = _started(work, ranks, stack)
                break
            except AssertionError as exc:
                stack.close()
                if attempt == ATTEMPTS:
                    raise
                notes.append(f"  start-up failed, started again on fresh ports: "
                             f"{str(exc).splitlines()[0]}")
        with stack:
            seen: set[str] = set()
            refreshes, loads = 0, []
            first = min(r.step or 0 for r in job.refresh()[0].ranks)
            began = time.monotonic()
            window_start, end = time.time(), began + seconds
            while time.monotonic() < end:
                snap, verdict = job.refresh()
                refreshes += 1
                seen |= {f"{f.cause}(rank {f.rank}, gpu {f.gpu})" for f in verdict.findings}
                loads.append(os.getloadavg()[0])
                watch.poll_values()
                time.sleep(0.5)
            watched_s = time.monotonic() - began
            steps = min(r.step or 0 for r in snap.ranks) - first
            alerts, problems = watch.alerts(), watch.rule_problems()
            n_alerting, n_recording = watch.rule_count()
            down, prom_low = watch.targets_down(window_start), watch.lowest_score()
            delivered = len(watch.hook.received())
            exprs = watch.expressions()
        run = read_windows(work, ranks, HEALTHY_LOG_EVERY, watched_s)
    flags = sum(len(w.flagged) for w in run.windows)
    low = sum(len(w.low) for w in run.windows)
    scored = [s for w in run.windows for s in w.scores.values() if s is not None]
    names = sorted({f"{a.name} {a.state}" for a in alerts})
    lines = [
        f"healthy {ranks} ranks: {watched_s:.0f} s watched, {steps} steps, load average "
        f"{statistics.fmean(loads):.1f} (max {max(loads):.1f}); findings {len(seen)} "
        f"{sorted(seen) or ''}; alerts pending/firing {len(alerts)} {names or ''}; "
        f"rank-windows flagged {flags}/{len(scored)}, lowest score "
        f"{min(scored, default=math.nan):.3f}",
        *notes,
        f"  diagnose: {refreshes} refreshes. Prometheus: shipped rules ({n_alerting} alerts, "
        f"{n_recording} recording), scrape {TRAINING_SCRAPE} training / {EVAL_INTERVAL_S}s "
        f"exporter, evaluation {EVAL_INTERVAL_S}s; failed scrapes while watched {down}; rules "
        f"in error {problems or 0}; notifications {delivered}; lowest score scraped "
        f"{prom_low if prom_low is None else round(prom_low, 3)}. Straggler: a window every "
        f"{HEALTHY_LOG_EVERY} steps (score over the last {BUSY_MIN_STEPS}), {low} rank-windows "
        f"scored below {STRAGGLER_SCORE_THRESHOLD} in one window; a save every "
        f"{HEALTHY_CKPT_EVERY} steps"]
    episodes = _episodes(run.windows, ranks)
    if episodes:
        both = sum(1 for w in run.windows for r in w.flagged
                   if (w.scores[r] or 1.0) < STRAGGLER_SCORE_THRESHOLD)
        lines.append(
            f"  flag episodes (rank: steps, ~seconds at {run.step_time_s * 1e3:.0f} ms/step; "
            f"lowest score before): " + "; ".join(
                f"{r}: {a}-{b}, {(b - a + HEALTHY_LOG_EVERY) * run.step_time_s:.1f} s; {lo:.3f}"
                for r, a, b, lo in episodes[:8])
            + f". Windows flagged AND below {STRAGGLER_SCORE_THRESHOLD} (the straggler "
            f"alert's condition, scraped every {TRAINING_SCRAPE}): {both}")
    for a in alerts:
        values = [v for v in watch.values.get(a.name, [])
                  if all(v[2].get(k) == x for k, x in a.labels.items())]
        lines.append(f"  {a.name} {a.state} {a.labels}: {a.first - window_start:+.0f}.."
                     f"{a.last - window_start:+.0f} s from the watch's start, {a.samples} "
                     f"evaluations; values {[round(float(v[0]), 3) for v in values][:5]}; "
                     f"expr: {exprs.get(a.name)}")
    return lines


def _episodes(windows, ranks: int) -> list[tuple[int, int, int, float]]:
    """(rank, first step, last step flagged, lowest score in the BUSY_MIN_STEPS before) of
    each stretch the monitor flagged a rank."""
    out = []
    for r in range(ranks):
        start = None
        for i, w in enumerate(windows):
            if r in w.flagged and start is None:
                start = i
            if start is not None and (r not in w.flagged or i == len(windows) - 1):
                end = i if r in w.flagged else i - 1
                before = [s for v in windows if windows[start].step - BUSY_MIN_STEPS
                          <= v.step <= windows[end].step and (s := v.scores[r]) is not None]
                out.append((r, windows[start].step, windows[end].step, min(before)))
                start = None
    return sorted(out, key=lambda e: e[1])
