"""End to end on CPU: a real 2-rank torchrun job (one restart allowed) whose rank 1 is SIGKILLed
at step CRASH_AT (``crash:rank=1,at_step=...``, first attempt only, like the OOM killer).

torchrun's agent then stops rank 0 and restarts both, so from outside both ranks vanish at once;
the old rule named rank 0 (the smallest of the tie). Checked: the engine, fed from the real
endpoint as `fsdpmon diagnose` feeds it, names rank 1 (``rank_missing``) within BOUND_S of the
crash and never names rank 0; the restarted ranks say how their previous lives ended (rank 1
killed, rank 0 stopped); then `fsdpmon diagnose --json`, started after the restart, names rank 1
too (the report carries its own time, so a fresh watch needs no history of the crash).
"""

from __future__ import annotations

import time

import pytest
from diagnose_job import cli_findings, diagnose_cli, faulty_job, named, stepping

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS

CRASH_AT = 20
BOUND_S = 30.0  # the finding within 30 s of the fault (restart included)
WATCH = f"{DIAGNOSIS_EVIDENCE_SECONDS + 2:g}s"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_killed_rank_is_named_not_the_one_the_agent_stopped(tmp_path):
    with faulty_job(tmp_path, 2, f"crash:rank=1,at_step={CRASH_AT}", max_restarts=1) as job:
        job.wait("both ranks stepping", stepping(2))
        fault_at = found = None
        said: list[tuple[str, int | None]] = []
        deadline = time.monotonic() + 120
        while found is None and time.monotonic() < deadline:
            snap, verdict = job.refresh()
            now = time.monotonic()
            if fault_at is None and any((r.step or 0) >= CRASH_AT or r.down for r in snap.ranks):
                fault_at = now
            said += [(f.cause, f.rank) for f in verdict.findings if (f.cause, f.rank) not in said]
            found = named(verdict.findings, "rank_missing", 1)
            time.sleep(0.5)
        assert fault_at is not None and found is not None, (said, job.log_tail())
        took = time.monotonic() - fault_at
        print(f"rank 1 named {took:.1f}s after the crash: {found.summary}; {found.evidence}")
        assert took <= BOUND_S, f"named {took - BOUND_S:.1f}s past the {BOUND_S:.0f}s bound"
        assert all(rank != 0 for _, rank in said), f"rank 0 was named: {said}"
        rows = {r.rank: r for r in snap.ranks}
        assert (rows[1].previous_exit, rows[1].restarts) == ("killed", 1), rows[1]
        assert rows[0].previous_exit in ("sigterm", "error"), rows[0]  # stopped, or gloo's error
        assert (rows[1].previous_exit_step or 0) >= CRASH_AT - 5, rows[1]  # its last log step
        assert any("rank 1 died without exiting" in e for e in found.evidence), found.evidence

        code, findings = cli_findings(diagnose_cli(job, WATCH))
        crashed = [(f["cause"], f["rank"]) for f in findings]
        assert ("rank_missing", 1) in crashed and code == 4, (code, findings)
