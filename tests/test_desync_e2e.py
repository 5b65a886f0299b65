"""A collective desync made from outside the injector, on one real 2-rank CPU job (torchrun,
the bundled trainer, the engine of `fsdpmon diagnose` fed from the pod's endpoint): in step
DESYNC_STEP rank 1 makes one extra all_reduce (tests/desync_trainer.py) while rank 0 goes on
to the step's first FSDP all-gather. The job hangs; `collective_desync` is named on rank 1
with both calls, never on rank 0 and never as a plain `hang`; before that step (the healthy
twin: the same job, the same refreshes) nothing of the kind is named."""

from __future__ import annotations

import time

import pytest
from desync_trainer import DESYNC
from diagnose_job import REPO, faulty_job, named, stepping

DESYNC_STEP = 30
# Every rank's loader waits PACE_S a batch (the injector's data-slow on both ranks alike: no
# straggler), so the healthy twin lasts at least DESYNC_STEP x PACE_S = 3 s on any machine: a
# run beside other e2e files at load 7 reached the desync step after one refresh.
PACE_S = 0.1
PACE = ";".join(f"data-slow:rank={r},seconds={PACE_S:g}" for r in (0, 1))
DEADLINE_S = 60.0  # from the last step to the finding: the evidence window is 10 s of it
CAUSES = ("collective_desync", "hang")


@pytest.mark.slow
def test_an_extra_all_reduce_on_rank_1_is_named_a_desync_on_rank_1(tmp_path):
    with faulty_job(tmp_path, 2, PACE, entry=(str(REPO / "tests" / "desync_trainer.py"),),
                    env_extra={DESYNC: f"rank=1,step={DESYNC_STEP}"}) as job:
        job.wait("both ranks stepping", stepping(2))
        healthy, stopped, found = 0, None, None
        deadline = time.monotonic() + DEADLINE_S + 60.0
        while found is None and time.monotonic() < deadline:
            snap, verdict = job.refresh()
            steps = [r.step or 0 for r in snap.ranks]
            wrong = [f for f in verdict.findings if f.cause in CAUSES and f.rank != 1]
            assert not wrong, f"named the wrong rank or a plain hang: {wrong}"
            if max(steps, default=0) < DESYNC_STEP - 1:
                healthy += 1  # the twin: healthy steps, nothing of the kind named
                assert not [f for f in verdict.findings if f.cause in CAUSES], verdict
            elif stopped is None:
                stopped = time.monotonic()
            found = named(verdict.findings, "collective_desync", 1)
            time.sleep(0.5)
        assert found is not None, f"not named: {verdict.findings}\n{job.log_tail()}"
        took = time.monotonic() - (stopped or time.monotonic())
        print(f"collective_desync named on rank 1 {took:.1f}s after the last step "
              f"({healthy} healthy refreshes before): {found.evidence[:2]}")
        assert took < DEADLINE_S, took
        assert healthy >= 2, healthy
        assert found.evidence[0].startswith(
            "rank 1 all_reduce 1 float32 vs rank 0 all_gather_single"), found.evidence
        assert f"(step {DESYNC_STEP})" in found.evidence[0], found.evidence
        assert not named(verdict.findings, "hang"), verdict.findings
