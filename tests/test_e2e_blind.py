"""Faults made from outside the trainer, on one real 2-rank CPU job (torchrun, the bundled
trainer, the engine of `fsdpmon diagnose` fed from the pod's endpoint as it is fed there):

1. A NaN is born in rank 1's logits at step NAN_STEP (patched in by tests/trainer_outside_faults.py,
   not FSDPMON_FAULT). The gradient reduce spreads it to rank 0's grad norm that step and its
   loss the next; `loss_nonfinite` is named on rank 1 at step NAN_STEP, never on rank 0, and rank
   1's JSONL holds the batch of that step, which fsdpmon.trainer.data.batch_at replays.
2. At the same time rank 1 shares one core with two busy loops (taskset): `host_cpu_contention`
   on rank 1, never on rank 0.
3. Released; then rank 0 is put in a cgroup with a CPU quota of QUOTA_PERCENT of a core (cgroup
   v2 cpu.max, or v1's cpu controller on a hybrid host; skipped, saying why, where neither can
   be written): `cpu_throttled` on rank 0, never on rank 1 once its own starvation has cleared.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from cpu_starve import QuotaUnavailable, cpu_quota, neighbours
from diagnose_job import REPO, Job, faulty_job, named, stepping, workers
from trainer_outside_faults import NAN_INPUTS, NAN_LOGITS

from fsdpmon.trainer.config import TrainConfig
from fsdpmon.trainer.data import SyntheticSource, batch_at

NAN_STEP = 30
QUOTA_PERCENT = 25
DEADLINE_S = 90.0  # generous: a loaded 2-core host took 18-27 s to name each (bench_blind.py)
CPU_CAUSES = ("host_cpu_contention", "cpu_throttled")


def watch(job: Job, done, forbidden, what: str) -> tuple[float, list]:
    """Refresh until ``done(findings)``; no refresh may hold a finding ``forbidden`` names."""
    started = time.monotonic()
    while time.monotonic() - started < DEADLINE_S:
        _snap, verdict = job.refresh()
        wrong = [f for f in verdict.findings if forbidden(f)]
        assert not wrong, f"{what}: named the wrong rank: {wrong}"
        if done(verdict.findings):
            return time.monotonic() - started, list(verdict.findings)
        time.sleep(0.5)
    raise AssertionError(f"{what}: not named within {DEADLINE_S:.0f}s: {verdict.findings}\n"
                         f"{job.log_tail()}")


@pytest.mark.slow
@pytest.mark.alone
def test_nan_origin_cpu_starvation_and_cpu_limit_are_named_on_their_rank(tmp_path):
    probe = subprocess.Popen(["sleep", "30"])
    try:
        with cpu_quota(probe.pid, 100):
            pass  # can a quota be set here at all?
    except QuotaUnavailable as why:
        pytest.skip(str(why))
    finally:
        probe.kill()
        probe.wait()
    jsonl = tmp_path / "log.jsonl"
    with faulty_job(tmp_path, 2, extra=("--log-jsonl", str(jsonl)),
                    entry=(str(REPO / "tests" / "trainer_outside_faults.py"),),
                    env_extra={NAN_LOGITS: f"rank=1,step={NAN_STEP}",
                              NAN_INPUTS: str(tmp_path / "poisoned.pt")}) as job:
        job.wait("both ranks stepping", stepping(2))
        pids = workers(job)
        assert set(pids) == {0, 1}, pids
        with neighbours(pids[1], core=1):
            took, found = watch(
                job, lambda fs: named(fs, "loss_nonfinite", 1) and named(fs, CPU_CAUSES[0], 1),
                lambda f: f.rank == 0 and f.cause in (*CPU_CAUSES, "loss_nonfinite"),
                "NaN origin and CPU starvation")
        print(f"NaN origin and starvation of rank 1 named after {took:.1f}s")
        nan = named(found, "loss_nonfinite", 1)
        assert f"at step {NAN_STEP}" in nan.summary and nan.node, nan
        starved = named(found, "host_cpu_contention", 1)
        assert any("waits for a CPU" in e for e in starved.evidence), starved.evidence
        watch(job, lambda fs: not any(f.cause in CPU_CAUSES for f in fs), lambda f: False,
              "rank 1's starvation to clear once released")
        with cpu_quota(pids[0], QUOTA_PERCENT):
            took, found = watch(job, lambda fs: named(fs, "cpu_throttled", 0),
                                lambda f: f.rank == 1 and f.cause in CPU_CAUSES,
                                "the CPU limit on rank 0")
        print(f"rank 0's CPU limit named after {took:.1f}s: {named(found, 'cpu_throttled', 0)}")
    first = [json.loads(x) for x in Path(tmp_path / "log.rank1.jsonl").read_text().splitlines()
             if '"kind":"nonfinite"' in x]
    assert [(r["what"], r["step"]) for r in first] == [("loss", NAN_STEP),
                                                      ("grad_norm", NAN_STEP)], first
    # The batch it names is the one the poisoned forward saw: replayed from the position alone
    # (the job's data: synthetic, the tiny model's vocabulary, --seq-len 32, the default seed).
    position = first[0]["batch"]["position"]
    assert position == (NAN_STEP - 1) * 2 * 2, position  # batch 2 x 2 ranks per step before
    (inputs, _targets), = batch_at(SyntheticSource(512, 32, TrainConfig().seed), 2, 1, 2,
                                   position)
    assert torch.equal(inputs, torch.load(tmp_path / "poisoned.pt")), position
