"""End to end on CPU: one real 2-rank torchrun job (checkpointing every CKPT_EVERY steps) and the
exporter with simulated GPUs, diagnosed as a person would: `fsdpmon diagnose --json` and top's
Diagnosis view in tmux.

1. Healthy (straggler scores served, cheap saves every CKPT_EVERY steps): `fsdpmon diagnose
   --json` names nothing and exits 0, and neither does the engine on any refresh.
2. GPU faults start (a thermally throttled GPU 1, an XID 79 on GPU 0) and, TRAIN_AFTER_S after
   the first step, trainer faults (rank 0's compute 3x slower, rank 1's saves 5 s longer). Each
   is named with its culprit within max(3 log windows, 30 s) of its start: `gpu_throttled` and
   `gpu_xid` with the GPU and the rank it serves, `straggler_compute` on rank 0,
   `checkpoint_slow` on rank 1 (the rank the other waited for).
3. Then `fsdpmon diagnose --json` names the trainer faults with their ranks too, and top's
   Diagnosis view (tmux, started before the faults) shows the GPU findings.
4. Rank 1's worker is SIGKILLed (as the OOM killer or `crash:rank=1` kill it); torchrun's agent
   (one restart allowed) stops rank 0 and restarts both, so both vanish at once. The engine, fed
   from the real endpoints, names rank 1 (`rank_missing`; the old rule named rank 0, the
   smallest of the tie) within BOUND_S, never rank 0: the restarted rank 1 says it was killed,
   rank 0 that it was stopped (SIGTERM, or gloo's error when its peer vanished).
One job for all of it keeps the suite's cost to one torchrun start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import psutil
import pytest
from diagnose_job import REPO, Job, cli_findings, diagnose_cli, faulty_job, named, stepping
from test_e2e_top import Tmux, _wait

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS

WATCH = f"{DIAGNOSIS_EVIDENCE_SECONDS + 2:g}s"  # diagnose's --for: one evidence window and more
# GPU faults start (from the exporter's start) after the healthy watch (WATCH plus the CLI's
# start-up, ~1.5 s here, plus up to one refresh of this test's loop, ~2 s), begun with the
# exporter, is over: 10 s over WATCH leaves room for a machine three times as slow.
FAULT_AFTER_S = DIAGNOSIS_EVIDENCE_SECONDS + 12
BOUND_S = 30.0  # max(3 log windows, 30 s): a log window here is 5 steps of well under 2 s
FAULTS = f"gpu-throttle:gpu=1,after={FAULT_AFTER_S:g},reason=thermal;" \
         f"xid:gpu=0,code=79,after={FAULT_AFTER_S:g}"
# Trainer faults: from this long after the first step (the exporter starts a little after it),
# whatever the machine's speed; the first slow save is the first after it.
CKPT_EVERY = 40
TRAIN_AFTER_S = FAULT_AFTER_S + 2
SLOW_SAVE_S = 5.0
TRAIN_FAULTS = f"compute-slow:rank=0,factor=3,after={TRAIN_AFTER_S:g};" \
               f"checkpoint-slow:rank=1,seconds={SLOW_SAVE_S:g},after={TRAIN_AFTER_S:g}"


@pytest.mark.slow
@pytest.mark.alone
def test_faults_named_with_their_rank_by_diagnose_and_in_top(tmp_path):
    t0 = time.monotonic()
    extra = ("--checkpoint-every", str(CKPT_EVERY), "--checkpoint-dir", str(tmp_path / "ckpt"))
    with faulty_job(tmp_path, 2, TRAIN_FAULTS, extra, max_restarts=1) as job:
        job.wait("both ranks stepping", stepping(2))
        startup_s = time.monotonic() - t0
        print(f"stepping after {startup_s:.1f}s")
        job.start_exporter(FAULTS)
        healthy_watch(job)
        tmux = Tmux()
        try:  # top runs before the faults start, as it would on a person's screen
            tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                 f"cd {REPO} && {sys.executable} -m fsdpmon.cli top --targets "
                 f"{','.join(job.urls)} --interval 1 2> {tmp_path / 'top.err'}")
            tmux.wait_for("RUNNING")
            seen, findings, code = faults_named(job, tmux)
        finally:
            tmux.kill()
        # Named once the agent has restarted both ranks: on a slow machine that restart (torch
        # imported again, the group joined again) can take as long as the first start-up.
        crash_named(job, max(BOUND_S, startup_s + 10.0))
    late = {k: round(t, 1) for k, t in seen.items() if t > BOUND_S}
    assert not late, f"named later than {BOUND_S}s after the fault started: {late}"
    said = [(f["cause"], f["rank"]) for f in findings]
    assert ("straggler_compute", 0) in said and ("checkpoint_slow", 1) in said, (
        f"diagnose --json said {said}: {findings}")
    # This watch begins after the XID rose (a rise before its own history is no news), so
    # what it can name is what lasts: the throttled GPU, the straggler, the slow checkpoint,
    # all warnings; warnings only exit 0 (the command's documented exit status).
    assert ("gpu_xid", 0) not in said and code == 0, f"diagnose exited {code} with {said}"
    assert {f["severity"] for f in findings} == {"warning"}, findings
    checkpoint = next(f for f in findings if f["cause"] == "checkpoint_slow")
    assert any("waited for rank 1" in e for e in checkpoint["evidence"]), checkpoint


def trainer_fault_at(job: Job) -> float:
    """When the trainer faults start, at the earliest (monotonic)."""
    assert job.first_step_after is not None, "no step seen"
    return job.first_step_after + TRAIN_AFTER_S


def healthy_watch(job: Job) -> None:
    fault_at = min(job.exporter_started + FAULT_AFTER_S, trainer_fault_at(job))
    proc = diagnose_cli(job, WATCH)
    seen: list[str] = []
    step, tied = 0, False
    while proc.poll() is None:
        snap, verdict = job.refresh()
        seen += [f"{f.cause} {f.summary}" for f in verdict.findings]
        step = max([step, *(r.step or 0 for r in snap.ranks)])
        tied = tied or stepping(2, gpus=True)(snap)
        time.sleep(0.5)
    ended = time.monotonic()
    code, findings = cli_findings(proc)
    saves = [r.checkpoint_seconds for r in snap.ranks]
    assert ended < fault_at, (
        f"the healthy watch ran {ended - fault_at:.1f}s into the faults: raise FAULT_AFTER_S")
    assert findings == [] and code == 0, f"healthy: diagnose said {findings} (exit {code})"
    assert tied, "the exporter's GPUs were never tied to the ranks during the healthy watch"
    assert seen == [], f"healthy: the engine said {seen}"
    assert all(x is not None for x in saves), (
        f"no save served by step {step} ({saves}): checkpoint_slow was not exercised")
    scored = [r.straggler_score for r in snap.ranks]
    assert all(s is not None for s in scored), f"no straggler score yet at step {step}: {scored}"


def faults_named(job: Job, tmux: Tmux) -> tuple[dict[str, float], list[dict], int]:
    """Refresh until the four faults are named; then `fsdpmon diagnose --json` watches (top's
    Diagnosis view is checked meanwhile). Seconds from each fault's start to the first refresh
    naming it, and what diagnose said."""
    gpu_at = job.exporter_started + FAULT_AFTER_S
    train_at = trainer_fault_at(job)
    save_at = None  # the first slow save's start (up to a checkpoint interval after train_at)
    expected = {"throttle": ("gpu_throttled", 1, "1"), "xid": ("gpu_xid", 0, "0"),
                "compute": ("straggler_compute", 0, None),
                "checkpoint": ("checkpoint_slow", 1, None)}
    seen: dict[str, float] = {}
    deadline = max(gpu_at, train_at) + BOUND_S + 10
    previous = time.monotonic()
    while len(seen) < len(expected) and time.monotonic() < deadline:
        began_refresh = time.monotonic()
        snap, verdict = job.refresh()
        now = time.monotonic()
        if now < min(gpu_at, train_at) - 1:
            assert verdict.findings == (), f"healthy: the engine said {verdict.findings}"
        save = next((r.checkpoint_seconds for r in snap.ranks if r.rank == 1), None)
        if save_at is None and save is not None and save >= SLOW_SAVE_S:
            # it ended after the previous refresh, so it began after this (a lower bound)
            save_at = previous - save
            deadline = max(deadline, save_at + BOUND_S + 10)
        previous = began_refresh
        for key, (cause, rank, gpu) in expected.items():
            began = gpu_at if gpu else (save_at if key == "checkpoint" else train_at)
            if began is None:
                continue
            if key not in seen and now >= began and named(verdict.findings, cause, rank, gpu):
                seen[key] = now - began
        time.sleep(0.5)
    assert set(seen) == set(expected), (seen, verdict.findings, job.log_tail())
    print(f"named after the fault: { {k: round(t, 1) for k, t in seen.items()} }")
    xid = named(verdict.findings, "gpu_xid", gpu="0")
    assert xid and xid.severity == "critical" and "XID 79" in xid.summary, xid

    proc = diagnose_cli(job, WATCH)
    tmux("send-keys", "-t", "top", "5")
    screen = _wait("the GPU findings in the Diagnosis view",
                   lambda: "gpu_xid:" in (s := tmux.screen()) and "gpu_throttled:" in s and s, 30)
    assert "rank 1 · pod" in screen or "rank 1 ·" in screen, screen
    assert "! gpu_xid:" in screen.split(" 1 Ranks")[0], screen  # the header's line
    code, findings = cli_findings(proc)
    return seen, findings, code


def _worker_pids(job: Job) -> dict[int, int]:
    """RANK -> pid of torchrun's worker processes."""
    out = {}
    for proc in psutil.Process(job.train.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rank = proc.environ().get("RANK")
            if rank is not None and "fsdpmon.trainer.train" in " ".join(proc.cmdline()):
                out[int(rank)] = proc.pid
    return out


def crash_named(job: Job, bound_s: float) -> None:
    """SIGKILL rank 1; the engine names it (not rank 0) once the agent has restarted both,
    within ``bound_s``."""
    pids = _worker_pids(job)
    assert set(pids) == {0, 1}, pids
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    found, said = None, set()
    while found is None and time.monotonic() < killed_at + bound_s + 30:
        snap, verdict = job.refresh()
        said |= {(f.cause, f.rank) for f in verdict.findings
                 if f.cause in ("rank_missing", "crash_loop")}
        found = named(verdict.findings, "rank_missing", 1)
        time.sleep(0.5)
    took = time.monotonic() - killed_at
    assert found is not None, (said, job.log_tail())
    print(f"crash: rank 1 named {took:.1f}s after its SIGKILL: {found.evidence}")
    assert took <= bound_s, f"named {took - bound_s:.1f}s past the {bound_s:.0f}s bound"
    assert (("rank_missing", 0) not in said and ("crash_loop", 0) not in said), said
    rows = {r.rank: r for r in snap.ranks}
    assert (rows[1].previous_exit, rows[1].restarts) == ("killed", 1), rows[1]
    assert rows[0].previous_exit in ("sigterm", "error"), rows[0]
    assert any("rank 1 died without exiting" in e for e in found.evidence), found.evidence
