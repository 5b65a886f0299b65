"""End to end: one 2-rank CPU run (torchrun, gloo, a real Prometheus scraping the pod's
endpoint) carrying four faults in sequence, each of a cost the test knows from outside
(tests/goodput_scenario.py): rank 0's loader slowed for 16 steps, rank 1 stopped (SIGSTOP)
for 6 s and continued, rank 0's saves slowed from step 30, rank 1 SIGKILLed at step 37 with
checkpoints every 10 steps (torchrun restarts the group, which resumes from step 30).

After the job is gone:
- `fsdpmon goodput --json` splits the wall clock by cause, each within 5% or 1 s of the truth
  (whichever is larger), the parts summing to the wall;
- `fsdpmon incidents --json` lists each fault the judge can name once, with its culprit, from
  the JSONL and from Prometheus' history (range queries), and no other;
- the live badput counters, as Prometheus kept them, agree with the truth of what came after
  its first sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from goodput_scenario import Scenario, data_wait_after, run, tolerance, truth
from prometheus_stack import PROMETHEUS, free_port, prometheus
from trainer_launch import REPO

from fsdpmon import catalog
from fsdpmon.dashboards.generate import rules_yaml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK), reason="Debian prometheus missing"),
]

# The slowed loader (steps 4-19) is goodput's data wait, but no door names a straggler for it:
# the live judge reads the monitor's straggler score, which needs BUSY_MIN_STEPS steps of busy
# time first, and the incidents replay that judge (before, each door judged busy time itself,
# and Prometheus' door named rank 0 a compute straggler during its slow save, as CI once saw).
EXPECTED = {("rank_unresponsive", 1), ("checkpoint_slow", 0), ("rank_missing", 1)}


def _fsdpmon(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _check(name: str, measured: float, expected: float) -> str | None:
    off = measured - expected
    return None if abs(off) <= tolerance(expected) else (
        f"{name}: measured {measured:.2f} s, truth {expected:.2f} s, off by {off:+.2f} s "
        f"(allowed {tolerance(expected):.2f} s)")


def test_goodput_and_incidents_of_four_faults_against_the_truth(tmp_path):
    port = free_port()
    sc = Scenario(port=port)
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml())
    # scraping before the job starts (Prometheus applies its targets only 5 s after its start):
    # otherwise the first sample can come after the slowed loader's first steps
    with prometheus(tmp_path, {"fsdpmon-train": f"127.0.0.1:{port}"}, rules,
                    f"http://127.0.0.1:{free_port()}", await_targets=True) as prom:
        seen = run(sc, tmp_path)
        assert seen.code == 0, "".join(seen.output[-40:])
        known = truth(sc, seen)
        logged = "".join(seen.output)
        assert "fsdpmon flight recorder: rank 0 stalled at step" in logged, logged[-3000:]

        # -- goodput from the files alone ------------------------------------------------
        gp = _fsdpmon("goodput", str(tmp_path / "logs"), "--json")
        assert set(gp) == {"wall_seconds", "productive_seconds", "goodput_ratio",
                           "badput_seconds"}, gp
        bad = gp["badput_seconds"]
        assert list(bad) == ["startup", "data_wait", "checkpoint_save", "checkpoint_restore",
                             "restart", "recompute", "stall", "straggler_wait", "unaccounted"]
        parts = gp["productive_seconds"] + sum(bad.values())
        assert abs(parts - gp["wall_seconds"]) <= 0.01 * gp["wall_seconds"], (parts, gp)
        measured = {**bad, "wall_seconds": gp["wall_seconds"],
                    "restart+restore": bad["restart"] + bad["checkpoint_restore"]}
        misses = [m for k, v in known.items() if (m := _check(k, measured[k], v))]
        assert not misses, f"{misses}\nmeasured {measured}\ntruth {known}"

        # -- incidents: each fault once, with its culprit, from the JSONL and from history --
        for source in ([str(tmp_path / "logs")],
                       ["--prometheus", prom.url, "--job", sc.job, "--since", "10m",
                        "--step", "1"]):
            found = _fsdpmon("incidents", *source, "--json")["incidents"]
            named = [(i["cause"], i["rank"]) for i in found]
            assert sorted(named) == sorted(EXPECTED), f"{source[0]}: {found}"
            for incident in found:
                assert incident["node"] == "node-a" and incident["start"] <= incident["end"]
                assert set(incident) == {"start", "end", "cause", "rank", "pod", "node", "gpu",
                                         "evidence", "lost_gpu_seconds"}, incident
            hang = next(i for i in found if i["cause"] == "rank_unresponsive")
            if source[0] != "--prometheus":  # the flight recorder's stack of the waiting rank
                # rank 0 waits in whichever collective came next (an all-gather, a
                # reduce-scatter, the grad norm's all-reduce): one is named, with its frames
                assert any(e.startswith("rank 0 at step") and "last collective -" not in e
                           and not e.endswith("no frames") for e in hang["evidence"]), hang
            # two GPUs idle for the stop's length, give or take a step and a scrape
            assert abs(hang["lost_gpu_seconds"] - 2 * known["stall"]) <= 2 * tolerance(
                known["stall"]) + 2, (hang, known["stall"])

        # -- the live counters, as Prometheus kept them (counters reset at the restart) -----
        badput = f'{catalog.TRAIN_BADPUT_SECONDS_TOTAL.name}{{job_name="{sc.job}"}}'
        live = {s["metric"]["cause"]: float(s["value"][1]) for s in prom.query(
            f"sum by (cause) (increase({badput}[10m]))")}
        # the endpoint opens just before step 1, so the first scrape may follow a slowed step
        # or two: the truth is what came after Prometheus' first sample
        first = min(float(s["values"][0][0]) for s in prom.query(f"{badput}[10m]"))
        can_see = {"data_wait": data_wait_after(sc, seen, first), "stall": known["stall"]}
        assert can_see["data_wait"] >= known["data_wait"] / 2, (
            f"Prometheus' first sample came {first - seen.worker_start:.2f} s after the "
            f"workers' start: {can_see['data_wait']:.2f} s of {known['data_wait']:.2f} s of "
            f"data wait left to see")
        misses = [m for k in ("data_wait", "stall")
                  if (m := _check(f"live {k}", live.get(k, 0.0), can_see[k]))]
        assert not misses, f"{misses}: live {live}, first sample at {first}"
