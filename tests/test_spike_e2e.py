"""A loss spike made from outside the injector, on one real 2-rank CPU job (torchrun, the
bundled trainer with rank 1's logits scaled by SCALE while a trigger file says so:
tests/spike_trainer.py; the engine of `fsdpmon diagnose` fed from the pod's endpoint). While
it lasts `loss_spike` is named on rank 1, with the step it began on; before it (the healthy
twin: the same job, the same refreshes) nothing about the loss or the grad norm is named; once
it is over, `fsdpmon incidents` on the run's JSONL lists it, rank 1, with that step."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time

import pytest
from diagnose_job import REPO, faulty_job, named, stepping
from spike_trainer import SPIKE

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS

# The issue scaled a trained model's logits by 30 (its loss 1.8 -> 8.3). The tiny model here is
# at its first steps, its logits near 0 and its loss near ln(vocab) (5.8): x30 moved rank 1's
# loss both ways (2.4-9) and the job's not to twice its level, though its grad norm rose 15-fold
# (training_unstable's case). x300 took rank 1's loss to 15-55, the job's dipping under twice
# its level within 10 s as the model adapted; x1000 holds the job loss above it, as the issue's
# spike held for 50 s.
SCALE = 1000.0
CALM_S = 4.0  # refreshes before the spike: the recent level (at least 3 losses)
DEADLINE_S = DIAGNOSIS_EVIDENCE_SECONDS + 15.0  # from the spike's start to the finding
QUALITY = ("loss_spike", "training_unstable")
# The model adapts to the spike by steps, not by seconds: flat out alone on the 2-core VM
# (25 steps/s) the job loss was back under 2x its level within the evidence window, and the
# spike went unnamed. Every rank's loader waits PACE_S a batch (the injector's data-slow, on
# both ranks alike: no straggler), so no machine runs more than 1/PACE_S steps a second. Paced
# at 0.1 s (5.9 steps/s) the job loss stayed >= 37 through the window against a line of 12,
# still rising 24 steps in; at PACE_S, 4.2 steps/s and >= 24 there.
PACE_S = 0.15
PACE = ";".join(f"data-slow:rank={r},seconds={PACE_S:g}" for r in (0, 1))


def began_at(evidence: tuple[str, ...] | list[str]) -> int | None:
    """The step the evidence says rank 1's loss rose first at."""
    found = re.search(r"rank 1 at step (\d+), before the others", " ".join(evidence))
    return int(found.group(1)) if found else None


def watch_calm(job, seconds: float) -> float:
    """Refreshes for ``seconds`` naming nothing about the loss; the steps a second made."""
    start, first = time.monotonic(), None
    while time.monotonic() - start < seconds:
        snap, verdict = job.refresh()
        first = first or (time.monotonic(), snap.step or 0)
        assert not [f for f in verdict.findings if f.cause in QUALITY], verdict.findings
        time.sleep(0.5)
    return ((snap.step or 0) - first[1]) / max(time.monotonic() - first[0], 1e-3)


def watch_spike(job, deadline_s: float):
    """Refreshes until loss_spike names rank 1 (None when it does not in ``deadline_s``)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        _, verdict = job.refresh()
        wrong = [f for f in verdict.findings if f.cause == "loss_spike" and f.rank == 0]
        assert not wrong, f"named the wrong rank: {wrong}"
        found = named(verdict.findings, "loss_spike", 1)
        if found is not None:
            return found
        time.sleep(0.5)
    return None


@pytest.mark.slow
def test_a_scaled_logits_spike_on_rank_1_is_named_while_it_lasts_and_listed_after(tmp_path):
    trigger = tmp_path / "spike.on"
    jsonl = tmp_path / "run" / "run.jsonl"
    jsonl.parent.mkdir()
    with faulty_job(tmp_path, 2, PACE, entry=(str(REPO / "tests" / "spike_trainer.py"),),
                    extra=("--log-every", "1", "--log-jsonl", str(jsonl)),
                    env_extra={SPIKE: f"rank=1,trigger={trigger}"}) as job:
        job.wait("both ranks stepping", stepping(2))
        rate = watch_calm(job, CALM_S)
        trigger.write_text(str(SCALE))
        started = time.monotonic()
        found = watch_spike(job, DEADLINE_S)
        took = time.monotonic() - started
        assert found is not None, f"not named in {DEADLINE_S}s\n{job.log_tail()}"
        first = int(trigger.with_suffix(".step").read_text())
        # the live judge sees the step a rank had published by its refresh (0.5 s apart)
        slack = math.ceil(2 * rate) + 1
        print(f"loss_spike named on rank 1 {took:.1f}s after the spike began at step {first} "
              f"({rate:.1f} steps/s): {found.evidence}")
        assert first <= (began_at(found.evidence) or -1) <= first + slack, found.evidence
        # named live after one evidence window of spike: hold it a little longer, or the
        # JSONL's judge may see just under a window of it (a fresh-clone run did)
        time.sleep(2.0)
        trigger.unlink()  # the spike is over before anyone runs incidents
        time.sleep(2.0)
    listed = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "incidents", str(jsonl),
                             "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    spikes = [i for i in json.loads(listed.stdout)["incidents"] if i["cause"] in QUALITY]
    print(f"incidents: {spikes}")
    # The norm the spike left high may outlast it: then `top` named training_unstable after
    # the spike (the job's, no rank), and its incident follows the spike's; nothing else.
    said = [(i["cause"], i["rank"]) for i in spikes]
    assert said in ([("loss_spike", 1)], [("loss_spike", 1), ("training_unstable", None)]), said
    assert all(i["start"] > spikes[0]["start"] for i in spikes[1:]), spikes
    assert first <= (began_at(spikes[0]["evidence"]) or -1) <= first + slack, spikes
