"""End to end on CPU: a real 2-rank torchrun job and the exporter with simulated GPUs. While
healthy, nothing is named; then GPU faults start (a thermally throttled GPU 1, an XID 79 on
GPU 0) and the diagnosis names each with its GPU and the rank it serves, within
max(3 log windows, 30 s) of the fault starting, and top's Diagnosis view shows the same
findings in tmux, as a person would see them."""

from __future__ import annotations

import sys
import time

import pytest
from diagnose_job import REPO, faulty_job, named, stepping
from test_e2e_top import Tmux, _wait

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS

FAULT_AFTER_S = DIAGNOSIS_EVIDENCE_SECONDS + 2  # a healthy stretch longer than one window
BOUND_S = 30.0  # max(3 log windows, 30 s): a log window here is 5 steps of well under 1 s
FAULTS = f"gpu-throttle:gpu=1,after={FAULT_AFTER_S:g},reason=thermal;" \
         f"xid:gpu=0,code=79,after={FAULT_AFTER_S:g}"


@pytest.mark.slow
def test_gpu_faults_named_with_their_rank_and_shown_in_top(tmp_path):
    t0 = time.monotonic()
    with faulty_job(tmp_path) as job:
        job.wait("both ranks stepping", stepping(2))
        print(f"stepping after {time.monotonic() - t0:.1f}s")
        job.start_exporter(FAULTS)
        job.wait("the exporter's GPUs tied to the ranks", stepping(2, gpus=True), 60)
        fault_at = job.exporter_started + FAULT_AFTER_S
        healthy: list[str] = []
        while time.monotonic() < fault_at - 1:
            _, verdict = job.refresh()
            healthy += [f"{f.cause} {f.summary}" for f in verdict.findings]
            time.sleep(0.5)
        assert healthy == [], healthy

        tmux = Tmux()
        try:
            tmux("new-session", "-d", "-s", "top", "-x", "120", "-y", "40",
                 f"cd {REPO} && {sys.executable} -m fsdpmon.cli top --targets "
                 f"{','.join(job.urls)} --interval 1 2> {tmp_path / 'top.err'}")
            tmux.wait_for("RUNNING")
            seen: dict[str, float] = {}
            while len(seen) < 2 and time.monotonic() < fault_at + BOUND_S + 10:
                _, verdict = job.refresh()
                for key, finding in (("throttle", named(verdict.findings, "gpu_throttled",
                                                         rank=1, gpu="1")),
                                     ("xid", named(verdict.findings, "gpu_xid", rank=0,
                                                   gpu="0"))):
                    if finding and key not in seen:
                        seen[key] = time.monotonic() - fault_at
                time.sleep(0.5)
            assert set(seen) == {"throttle", "xid"}, (seen, verdict.findings, job.log_tail())
            print(f"named after the fault: {seen}")
            late = {k: round(t, 1) for k, t in seen.items() if t > BOUND_S}
            assert not late, f"named later than {BOUND_S}s after the fault: {late}"
            xid = named(verdict.findings, "gpu_xid", gpu="0")
            assert xid and xid.severity == "critical" and "XID 79" in xid.summary, xid

            tmux("send-keys", "-t", "top", "5")
            screen = _wait("both findings in the Diagnosis view",
                           lambda: "gpu_xid:" in (s := tmux.screen()) and "gpu_throttled:" in s
                           and s, 30)
            assert "rank 1 · pod" in screen or "rank 1 ·" in screen, screen
            assert "! gpu_xid:" in screen.split(" 1 Ranks")[0], screen  # the header's line
        finally:
            tmux.kill()
