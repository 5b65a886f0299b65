"""Issue 48's proof that the doors agree: every door over the same recorded fault matrix
(tests/data/matrix/, recorded once by benchmarks/record_matrix.py: the fault kinds of
bench_diagnose and bench_blind that run on a CPU machine, and a healthy run saving checkpoints,
each a real 2-rank job) names the same (cause, rank), and the healthy run nothing anywhere.

The doors (tests/matrix_doors.py, matrix_prometheus.py, matrix_rules.py):
- `top` / `diagnose` on the pods: the recorded expositions and /stacks served again at each
  recorded moment, through TargetsSource and Diagnoser: the reference;
- `diagnose --prometheus`: the recording backfilled into a real Prometheus, PrometheusSource at
  each recorded moment, the judge over its snapshots;
- the rules: the shipped rules over the same series in `promtool test rules`;
- `incidents` from the JSONL, and `incidents --prometheus` from the backfilled Prometheus;
- goodput's attribution: the ranks it charges straggler time, a restart and the saves to.
A door may miss only what docs/architecture.md's table "What each door cannot see" lists for it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from matrix_doors import (
    Named,
    Recording,
    benchmark_faults,
    blind_spots,
    goodput_attribution,
    incidents_from_files,
    recordings,
)
from matrix_doors import live as live_door
from matrix_prometheus import backfilled, diagnose_prometheus, incidents_prometheus
from matrix_rules import rules_alerts
from prometheus_stack import PROMETHEUS

from fsdpmon.diagnose.findings import CAUSES, SLOWDOWN_CAUSES

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = {rec.name: rec for rec in recordings()}
REFERENCE = "top"  # the table's id of the door every other is compared with
DOORS = ("diagnose --prometheus", "rules", "incidents", "incidents --prometheus")

pytestmark = [
    pytest.mark.slow,  # promtool and Prometheus over the whole matrix: both cores, ~30 s
    pytest.mark.skipif(shutil.which("promtool") is None or not Path(PROMETHEUS).is_file(),
                       reason="promtool or prometheus missing: run scripts/setup.sh --test"),
]


def blind() -> dict[str, frozenset[str]]:
    return blind_spots((ROOT / "docs" / "architecture.md").read_text(), CAUSES)


@pytest.fixture(scope="module")
def said(tmp_path_factory) -> dict[str, dict[str, Named]]:
    """door -> recording name -> what it named; goodput's attribution under "goodput"."""
    work = tmp_path_factory.mktemp("doors")
    recs = list(RECORDINGS.values())
    rules: dict[str, Named] = {}
    # promtool's evaluation is the longest part: on the other core meanwhile
    (work / "rules").mkdir()
    promtool = threading.Thread(target=lambda: rules.update(rules_alerts(recs, work / "rules")))
    promtool.start()
    out: dict[str, dict] = {d: {} for d in (REFERENCE, *DOORS, "goodput")}
    for rec in recs:
        out[REFERENCE][rec.name] = live_door(rec)
        out["incidents"][rec.name] = incidents_from_files(rec, work / "files")
        out["goodput"][rec.name] = goodput_attribution(rec, work / "files")
    with backfilled(recs, work / "prometheus") as url:
        for rec in recs:
            out["diagnose --prometheus"][rec.name] = diagnose_prometheus(rec, url)
            out["incidents --prometheus"][rec.name] = incidents_prometheus(rec, url)
    promtool.join()
    out["rules"] = {rec.name: rules[rec.slug] for rec in recs}
    return out


def _show(named: Named) -> str:
    return ", ".join(f"{c} rank {r}" for c, r in sorted(named, key=str)) or "nothing"


def test_the_matrix_is_recorded_whole():
    """Every fault of bench_diagnose and bench_blind and the healthy run (the recorder takes
    them all; one that cannot run on a machine is reported skipped, not left out here)."""
    assert {"compute-slow", "cpu-neighbours"} <= benchmark_faults(), benchmark_faults()
    assert set(RECORDINGS) == benchmark_faults() | {"healthy"}, sorted(RECORDINGS)
    size = sum(p.stat().st_size for p in (ROOT / "tests" / "data" / "matrix").iterdir())
    assert size < 3 * 1024 * 1024, size


def test_the_table_names_every_door():
    assert set(blind()) == {REFERENCE, *DOORS, "goodput"}, blind()
    assert blind()[REFERENCE] == frozenset(), "the reference door must see every cause"


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_the_reference_names_the_fault(said, name):
    rec: Recording = RECORDINGS[name]
    named = said[REFERENCE][name]
    if rec.cause is None:
        assert not named, f"healthy run: {REFERENCE} named {_show(named)}"
    else:
        wanted = {(c, rec.rank) for c in (rec.cause, *rec.also)}
        assert named & wanted, (f"{name}: {REFERENCE} named {_show(named)}, not "
                                f"{rec.cause} rank {rec.rank}")


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_each_door_names_what_the_reference_names(said, name, door):
    ref = said[REFERENCE][name]
    can_see = {(c, r) for c, r in ref if c not in blind()[door]}
    got = said[door][name]
    assert got == can_see, (
        f"{name}: {door} named {_show(got)}; {REFERENCE} named {_show(ref)}, of which "
        f"{door} can see {_show(can_see)} (missing: {_show(can_see - got)}; "
        f"extra: {_show(got - can_see)})")


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_goodput_charges_the_ranks_the_judge_names(said, name):
    ref = said[REFERENCE][name]
    sees = {(c, r) for c, r in ref if c not in blind()["goodput"]}
    charged = said["goodput"][name]
    slow = {r for c, r in sees if c in SLOWDOWN_CAUSES}
    waited = {r for r, s in charged.get("straggler_wait", {}).items() if s > 0}
    assert waited == slow, (f"{name}: goodput charged straggler time to ranks {sorted(waited)}; "
                            f"{REFERENCE} named {_show(ref)}")
    restarted = set(charged.get("restart", {}))
    missing = {r for c, r in sees if c == "rank_missing" and r is not None}
    assert not restarted or restarted == missing, (
        f"{name}: goodput charged the restart to ranks {sorted(restarted)}; {REFERENCE} "
        f"named {_show(ref)}")
    saves = charged.get("checkpoint_save", {})
    for _, rank in (x for x in sees if x[0] == "checkpoint_slow"):
        top = max(saves, key=saves.__getitem__, default=None)
        assert top == rank, (f"{name}: goodput charged save time most to rank {top} "
                             f"({saves}); {REFERENCE} named checkpoint_slow rank {rank}")
