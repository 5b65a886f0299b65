"""Incidents' boundaries, fast and in memory: each case pins one comparison, constant or index
of ``fsdpmon.incidents.incidents`` (benchmarks/mutation.py) with a case on each side, asserting
on what a user is shown: the cause, the culprit, its place, the evidence, the cost."""

from __future__ import annotations

import pytest

from fsdpmon import conventions
from fsdpmon.diagnose.after import slow_save_groups
from fsdpmon.diagnose.findings import SLOWDOWN_CAUSES, Finding
from fsdpmon.diagnose.replay import (
    may_slow,
    replay,
    run_slowdowns,
    run_stragglers,
    slowdowns,
    spans,
)
from fsdpmon.incidents import incidents as inc_mod
from fsdpmon.incidents.incidents import Incident, incidents, lemon_nodes
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.run_snapshots import step_snapshots
from fsdpmon.job.runlog import Incarnation, RunLog

LIMIT = conventions.CHECKPOINT_SHARE_LIMIT


def run_rec(rank: int, start: float = 100.0, **extra) -> dict:
    return {"kind": "run", "rank": rank, "process_start": start, "world_size": 2, **extra}


def step(rank: int, n: int, end: float, seconds: float = 1.0, window: float | None = None,
         data: float = 0.0, wait: float = 0.0, steps: int = 1) -> dict:
    return {"kind": "step", "time": end, "rank": rank, "step": n, "step_seconds": seconds,
            "window_seconds": seconds if window is None else window, "data_seconds": data,
            "wait_seconds": wait, "steps": steps}


def life(index: int, runs: dict[int, dict], steps: dict[int, list[dict]],
         events: list[dict] = ()) -> Incarnation:
    return Incarnation(index, runs, steps, list(events))


def run_of(*lives: Incarnation, name: str = "hand") -> RunLog:
    places = {r: {"node": f"n{r}", "pod": f"p{r}"} for inc in lives for r in inc.runs}
    return RunLog(name, name, places, list(lives))


def found(run: RunLog) -> list[Incident]:
    return incidents(run, goodput(run, run_stragglers(run)))


def plain(items: list[Incident]) -> list[tuple]:
    return [(i.cause, i.rank, i.start, i.end, i.lost_gpu_seconds) for i in items]


# ---- place and cost ---------------------------------------------------------------------

def test_the_culprit_s_gpu_is_its_local_rank_on_a_gpu_host_none_on_a_cpu_one():
    gpu = {0: run_rec(0, device="NVIDIA H100", local_rank=0),
           1: run_rec(1, device="NVIDIA H100", local_rank=1)}
    cpu = {0: run_rec(0, device="cpu", local_rank=0), 1: run_rec(1, device="cpu", local_rank=1)}
    nan = [{"kind": "nonfinite", "time": 101.5, "rank": 1, "what": "loss", "step": 2}]
    two = {r: [step(r, 1, 101.0), step(r, 2, 102.0)] for r in (0, 1)}
    on_gpu = found(run_of(life(0, gpu, two, nan)))
    on_cpu = found(run_of(life(0, cpu, two, nan)))
    assert [(i.rank, i.node, i.pod, i.gpu) for i in on_gpu] == [(1, "n1", "p1", "1")], on_gpu
    assert [(i.rank, i.node, i.pod, i.gpu) for i in on_cpu] == [(1, "n1", "p1", "")], on_cpu
    # a later life without that rank's run record keeps the GPU the rank had
    later = found(run_of(life(0, gpu, two), life(1, {0: run_rec(0, 103.0)}, {}, nan)))
    assert [i.gpu for i in later if i.cause == "loss_nonfinite"] == ["1"], later


def test_the_first_non_finite_value_is_the_earliest_step_a_rank_without_one_first():
    runs = {0: run_rec(0), 1: run_rec(1)}
    two = {r: [step(r, 1, 101.0), step(r, 5, 105.0)] for r in (0, 1)}
    late_zero = [{"kind": "nonfinite", "time": 104.0, "rank": 0, "what": "loss", "step": 5},
                 {"kind": "nonfinite", "time": 101.5, "rank": 1, "what": "loss", "step": 2}]
    (nan,) = found(run_of(life(0, runs, two, late_zero)))
    assert (nan.rank, nan.start, nan.lost_gpu_seconds) == (1, 101.5, 0.0), nan
    unknown = [{"kind": "nonfinite", "time": 104.0, "rank": 0, "what": "loss", "step": 1},
               {"kind": "nonfinite", "time": 101.5, "rank": 1, "what": "grad"}]
    (nan,) = found(run_of(life(0, runs, two, unknown)))
    assert nan.rank == 1, f"a value of no known step counts as step 0: {nan}"


# ---- stragglers: the judge replayed over the recorded figures --------------------------------

def scored(r: int, n: int, end: float, busy: float, score: float | None, **figures) -> dict:
    return {**step(r, n, end, busy), "step_time_s": busy, "busy_s": busy,
            "data_wait_ratio": 0.0, "straggler_score": score, **figures}


def test_a_snapshot_per_log_step_holds_the_figures_each_rank_recorded():
    runs = {0: run_rec(0), 1: run_rec(1)}
    steps = {0: [scored(0, 1, 101.0, 1.0, 2.0, descheduled_span_ratio=0.25,
                        descheduled_ratio=0.5, straggling=True)],
             1: [scored(1, 1, 101.5, 2.0, 0.5), scored(1, 2, 102.0, 2.0, None)]}
    run = run_of(life(0, runs, steps))
    one, two = step_snapshots(run, run.incarnations[0])
    assert (one.time, one.step, [r.rank for r in one.ranks]) == (101.5, 1, [0, 1]), one
    zero = one.ranks[0]
    # the endpoint serves the span's descheduled share, not the window's
    assert (zero.straggler_score, zero.descheduled_ratio, zero.straggling) == (2.0, 0.25, True)
    assert (two.step, [r.rank for r in two.ranks], two.ranks[0].straggler_score) == (2, [1], None)


def straggling_run(extra: float, last: int = 16, score: float | None = None) -> RunLog:
    """Rank 1 works ``extra`` s more per step in steps 2..``last`` (compute) and its recorded
    score says so (or is ``score``); rank 0 waits it out. Steps end every second, in the run's
    second life."""
    runs = {0: run_rec(0), 1: run_rec(1)}
    slow = range(2, last + 1)
    own = (lambda n: 1 / (1 + extra * (n in slow))) if score is None else (lambda n: score)
    steps = {r: [{**scored(r, n, 100.0 + n, 1.0 + extra * (n in slow) * (r == 1),
                           own(n) if r == 1 else 1.0),
                  "step_seconds": 1.0 + extra * (n in slow),
                  "wait_seconds": extra * (n in slow) * (r == 0)} for n in range(1, 21)]
             for r in (0, 1)}
    return run_of(life(0, dict(runs), {}), life(1, runs, steps))


def test_a_compute_straggler_costs_what_the_goodput_split_lost_to_it():
    # named at step 12 (10 s of a score of 0.67), held to step 16: its span holds steps 2-16,
    # 15 windows of 0.5 s extra work each: 7.5 s, on 2 GPUs; in the run's second life
    (slow,) = [i for i in found(straggling_run(0.5)) if i.cause in SLOWDOWN_CAUSES]
    assert (slow.cause, slow.rank, slow.lost_gpu_seconds) == ("straggler_compute", 1, 15.0)
    assert slow.evidence[0] == "steps 2–16: rank 1 straggles: its own compute is slow", slow
    assert slow.evidence[2].startswith("busy 1.500 s"), slow.evidence


@pytest.mark.parametrize(("score", "charged"), [(1.0, 0.0), (0.5, 15 * 0.5)])
def test_goodput_charges_straggler_time_only_where_the_judge_names_a_straggler(score, charged):
    """The same windows (rank 1's own work 1.5 s against rank 0's 1.0 s, below the line by
    the window's own figures): straggler time only when the recorded score made the judge
    name rank 1 (steps 2-16, from its evidence's start to its last finding)."""
    run = straggling_run(0.5, score=score)
    gp = goodput(run, run_stragglers(run))
    assert gp.badput_seconds["straggler_wait"] == pytest.approx(charged), gp.badput_seconds
    assert gp.by_rank.get("straggler_wait", {}) == ({1: pytest.approx(charged)} if charged
                                                    else {}), gp.by_rank


def test_the_replay_judges_once_a_replay_interval_and_only_where_a_slowdown_can_stand():
    """Log steps of a twentieth of REPLAY_INTERVAL_SECONDS: judged once each interval, so the
    straggler's findings are as far apart, and still one span; the moments skipped for want
    of a rank below the line change nothing."""
    runs = {0: run_rec(0), 1: run_rec(1)}
    dt = conventions.REPLAY_INTERVAL_SECONDS / 20
    steps = {r: [scored(r, n, 100.0 + n * dt, 1.0, 0.5 if r == 1 and n > 60 else 1.0)
                 for n in range(1, 401)] for r in (0, 1)}
    run = run_of(life(0, runs, steps))
    snaps = step_snapshots(run, run.incarnations[0])
    every = replay(snaps)
    assert len({t for t, _ in every}) <= 20 / conventions.REPLAY_INTERVAL_SECONDS + 1, every
    assert slowdowns(every) == slowdowns(replay(snaps, judge_at=may_slow))
    _, found = run_slowdowns(run, run.incarnations[0])
    assert [(s.finding.cause, s.finding.rank) for s in found] == [("straggler_compute", 1)]


def test_findings_of_one_cause_and_rank_merge_within_the_gap():
    def said(t: float, cause: str = "straggler_data", rank: int = 1) -> tuple:
        return (t, Finding(cause, "warning", "s", rank=rank))
    one = spans([said(10), said(11), said(13)], gap=2)
    assert [(s.start, s.end, s.said) for s in one] == [(0.0, 13.0, 3)], one
    assert len(spans([said(10), said(11), said(13.5)], gap=2)) == 2, "more than the gap apart"
    other = spans([said(10), said(11, rank=0), said(12, "straggler_compute")], gap=2)
    assert [(s.finding.cause, s.finding.rank) for s in other] == [
        ("straggler_data", 1), ("straggler_data", 0), ("straggler_compute", 1)], other


# ---- stalls -----------------------------------------------------------------------------

def start(rank: int, seen: float, since: float = 200.0, threshold: float | None = 4.0,
          phase: str = "forward", frames: int = 1) -> dict:
    rec = {"kind": "stall", "state": "start", "time": since + seen, "rank": rank, "step": 2,
           "since": since, "phase": phase, "last_collective": {"op": "all_reduce"},
           "frames": [{"file": "t.py", "line": n, "function": f"f{n}"} for n in range(frames)]}
    if threshold is not None:
        rec["threshold"] = threshold
    return rec


def end(rank: int, seconds: float | None = 9.0, during: str = "step", at: float = 210.0,
        since: float = 200.0) -> dict:
    rec = {"kind": "stall", "state": "end", "time": at, "rank": rank, "step": 3,
           "since": since, "during": during}
    if seconds is not None:
        rec["seconds"] = seconds
    return rec


def stalled(events: list[dict], ranks: int = 3) -> list[Incident]:
    runs = {r: run_rec(r) | {"world_size": ranks} for r in range(ranks)}
    steps = {r: [step(r, 1, 199.0), step(r, 2, 200.0)] for r in range(ranks)}
    return [i for i in found(run_of(life(0, runs, steps, events)))
            if i.cause in ("hang", "rank_unresponsive")]


def test_a_rank_seeing_the_stall_exactly_at_threshold_plus_late_is_on_time():
    late = conventions.STALL_SEEN_LATE_SECONDS
    on_time = stalled([start(0, 4.5), start(1, 4.0 + late), start(2, 4.5), end(0)])
    assert [(i.cause, i.rank) for i in on_time] == [("hang", None)], on_time
    behind = stalled([start(0, 4.5), start(1, 4.0 + late + 0.25), start(2, 4.5), end(0)])
    assert [(i.cause, i.rank) for i in behind] == [("rank_unresponsive", 1)], behind
    # without a threshold told, lateness counts from the last progress itself
    untold = stalled([start(0, 1.0, threshold=None), start(1, late + 0.5, threshold=None),
                      start(2, 1.0, threshold=None), end(0)])
    assert [(i.cause, i.rank) for i in untold] == [("rank_unresponsive", 1)], untold


def test_a_stall_s_evidence_timing_and_cost():
    (hang,) = stalled([start(0, 4.5, frames=5), start(1, 4.5), start(2, 4.5, phase="data"),
                       end(0, 8.0), end(1, 8.5)])
    assert (hang.cause, hang.rank, hang.start, hang.end) == ("hang", 2, 200.0, 210.0), hang
    assert hang.lost_gpu_seconds == 3 * 8.5, "the most any rank lost, on every GPU"
    assert list(hang.evidence) == [
        "no step completed for 10.0 s (threshold 4.0 s)",
        "rank 0 at step 2 in phase forward, last collective all_reduce: "
        "f4 (t.py:4) < f3 (t.py:3) < f2 (t.py:2)",
        "rank 1 at step 2 in phase forward, last collective all_reduce: f0 (t.py:0)",
        "rank 2 at step 2 in phase data, last collective all_reduce: f0 (t.py:0)"], hang.evidence
    (gone,) = stalled([start(0, 4.5), start(1, 9.0), start(2, 4.5), end(0)])
    assert gone.evidence[1] == ("rank 1 was unresponsive meanwhile (stopped, or holding the "
                                "GIL)"), gone.evidence


def test_a_stall_that_never_ended_costs_until_its_last_record():
    (open_,) = stalled([start(0, 4.5), start(1, 4.5), start(2, 6.0)])
    assert (open_.end, open_.lost_gpu_seconds) == (206.0, 3 * 6.0), open_
    assert open_.evidence[0] == "no step completed for 6.0 s (threshold 4.0 s); it never ended"
    (nothing,) = stalled([start(0, 4.5), start(1, 4.5), start(2, 4.5), end(0, 0.0)])
    assert nothing.lost_gpu_seconds == 0.0, "it ended saying it lost nothing"
    (untold,) = stalled([start(0, 4.5), start(1, 4.5), start(2, 4.5), end(0, None)])
    assert untold.lost_gpu_seconds == 0.0, "an end record without its seconds: none known"


def test_a_stall_ended_by_a_save_or_seen_only_at_its_end_is_no_stall_incident():
    assert stalled([start(0, 4.5), start(1, 4.5), start(2, 4.5),
                    end(0, during="checkpoint")]) == []
    assert stalled([end(0), end(1), end(2)]) == [], "no start record: no story to tell"


def test_stall_records_group_by_their_last_progress_within_a_threshold():
    def groups(*sinces: float, threshold: float | None = None) -> list[list[float]]:
        events = [start(r, 1.0, since=s, threshold=threshold) for r, s in enumerate(sinces)]
        events.append({"kind": "stall", "state": "start", "rank": 9, "time": 1.0})  # no since
        return [[r["since"] for r in g] for g in inc_mod._stall_groups(life(0, {}, {}, events))]
    # no threshold told: within one second is one stall
    assert groups(101.0, 100.0) == [[100.0, 101.0]]
    assert groups(100.0, 101.5) == [[100.0], [101.5]]
    assert groups(100.0, 101.5, threshold=0.5) == [[100.0], [101.5]]
    assert groups(100.0, 101.5, threshold=1.5) == [[100.0, 101.5]]
    assert groups(100.0, 100.5, 101.25) == [[100.0, 100.5], [101.25]], "from the group's first"
    # an end record tells no threshold: the group's is its start records' (0.5 s here)
    mixed = [end(0, since=100.0), start(1, 1.0, since=100.0, threshold=0.5),
             start(2, 1.0, since=100.75, threshold=0.5)]
    assert [len(g) for g in inc_mod._stall_groups(life(0, {}, {}, mixed))] == [2, 1]


# ---- checkpoints --------------------------------------------------------------------------

def save(n: int, seconds: float, rank: int = 0, time: float | None = None) -> dict:
    return {"step": n, "seconds": seconds, "rank": rank, "time": float(n) if time is None
            else time}


def test_slow_saves_continue_at_exactly_twice_the_fastest_and_at_exactly_the_limit_stop():
    factor = conventions.SLOW_SAVE_FACTOR
    at = slow_save_groups([(save(10, 0.125), 0.0), (save(20, 2.0), 1.0),
                           (save(30, factor * 0.125), 0.0)])
    assert [[s["step"] for s, _ in g] for g in at] == [[20, 30]], at
    assert slow_save_groups([(save(10, 0.125), LIMIT)]) == [], "exactly the limit: not slow"
    # a save at exactly the limit after a healthy one does not carry a slow run on
    carried = slow_save_groups([(save(10, 0.125), 0.0), (save(20, 2.0), 1.0),
                                (save(30, 0.125), 0.0), (save(40, 2.0), LIMIT),
                                (save(50, 2.0), 0.0)])
    assert [[s["step"] for s, _ in g] for g in carried] == [[20]], carried
    # the run continues the latest group, of its own culprit
    two = slow_save_groups([(save(10, 0.125), 0.0), (save(20, 2.0), 1.0),
                            (save(30, 2.0, rank=1), 1.0), (save(40, 2.0, rank=1), 0.0)])
    assert [[(s["step"], s["rank"]) for s, _ in g] for g in two] == [[(20, 0)],
                                                                    [(30, 1), (40, 1)]], two


def saving_run(slow: float, own: float | None, at_begin: bool = False) -> RunLog:
    """Two ranks, steps of 1 s from 100; a 0.25 s save after step 2 and a ``slow`` one after
    step 4 (rank 1's own time ``own``); ``at_begin``: a 2 s save ending as step 1 begins."""
    runs = {0: run_rec(0), 1: run_rec(1)}
    steps, events, t = {0: [], 1: []}, [], 100.0
    for n in range(1, 7):
        window = 1.0 + (0.25 if n == 3 else 0.0) + (slow if n == 5 else 0.0)
        t += window
        for r in (0, 1):
            steps[r].append(step(r, n, t, 1.0, window))
        took = {2: 0.25, 4: slow}.get(n)
        for r in (0, 1) if took else ():
            rec = {"kind": "checkpoint", "time": t + took, "rank": r, "step": n,
                   "seconds": took}
            if own is not None:
                rec["own_seconds"] = own if r == 1 else 0.0
            events.append(rec)
    if at_begin:
        events += [{"kind": "checkpoint", "time": 100.0, "rank": r, "step": 0, "seconds": 2.0}
                   for r in (0, 1)]
    return run_of(life(0, runs, steps, events))


def checkpoint(run: RunLog) -> list[Incident]:
    return [i for i in found(run) if i.cause == "checkpoint_slow"]


def test_a_slow_save_costing_exactly_a_second_beyond_the_fastest_is_named():
    (slow,) = checkpoint(saving_run(1.25, 0.5))
    # from the save's begin (step 4 ended at 104.25) to its end; 1.0 s lost on 2 GPUs
    assert (slow.rank, slow.start, slow.end, slow.lost_gpu_seconds) == (1, 104.25, 105.5, 2.0)
    assert list(slow.evidence) == [
        "the save of step 4 took 1.2 s, 38% of the time since the previous save (limit 25%); "
        "rank 1 spent 0.5 s of it on its own work (the others waited for it)",
        "the run's fastest save took 0.25 s"], slow.evidence
    assert checkpoint(saving_run(1.125, 0.5)) == [], "0.875 s beyond the fastest: noise"
    (untold,) = checkpoint(saving_run(1.25, None))
    assert "rank 0 spent 0.0 s of it" in untold.evidence[0], untold.evidence


def test_slow_saves_after_under_a_second_of_steps_are_judged_by_their_share():
    # save A (0.5 s) after 0.5 s of steps: half the time since the first step began; B and C
    # as slow after it; the fastest 0.125 s: 3 x 0.375 s lost
    runs = {0: run_rec(0), 1: run_rec(1)}
    steps = {r: [step(r, 1, 100.5, 0.5), step(r, 5, 114.0)] for r in (0, 1)}
    events = [{"kind": "checkpoint", "rank": 0, "time": t, "step": n, "seconds": took}
              for n, t, took in ((1, 101.0, 0.5), (2, 105.0, 0.5), (3, 109.0, 0.5),
                                 (4, 113.0, 0.125))]
    (slow,) = checkpoint(run_of(life(0, runs, steps, events)))
    assert (slow.start, slow.end, slow.lost_gpu_seconds) == (100.5, 109.0, 2 * 1.125), slow


def test_a_save_ending_as_the_first_step_begins_has_no_share_to_judge():
    assert checkpoint(saving_run(0.25, 0.0, at_begin=True)) == []


def test_slow_saves_in_a_row_span_from_the_first_s_begin_to_the_last_s_end():
    groups = [(save(2, 0.25, time=102.25), 0.125), (save(4, 2.0, rank=1, time=106.0), 1.0),
              (save(6, 2.0, rank=1, time=110.0), 0.5)]
    runs = {0: run_rec(0), 1: run_rec(1)}
    steps = {r: [step(r, 1, 101.0), step(r, 8, 111.0)] for r in (0, 1)}
    events = [{"kind": "checkpoint", "rank": s["rank"], "time": s["time"], "step": s["step"],
               "seconds": s["seconds"]} for s, _ in groups]
    (slow,) = checkpoint(run_of(life(0, runs, steps, events)))
    assert (slow.start, slow.end, slow.rank) == (104.0, 110.0, 1), slow
    assert slow.lost_gpu_seconds == 2 * 2 * 1.75, slow


# ---- restarts -----------------------------------------------------------------------------

def restarted(restarts: int, ends: list[dict], restore: dict | None = None,
              second_steps: bool = True) -> list[Incident]:
    """Life 0: steps 1..6 of 1 s from 100, ended by ``ends``; life 1 starts at 110 and its
    first step begins at 120."""
    first = {r: [step(r, n, 100.0 + n) for n in range(1, 7)] for r in (0, 1)}
    runs1 = {r: run_rec(r, 110.0, restarts=restarts) for r in (0, 1)}
    later = {r: [step(r, 7, 121.0)] for r in (0, 1)} if second_steps else {}
    events = [restore] if restore else []
    lives = (life(0, {r: run_rec(r) for r in (0, 1)}, first, ends),
             life(1, runs1, later, events))
    return [i for i in found(run_of(*lives)) if i.cause in ("rank_missing", "crash_loop")]


def test_restarts_at_the_crash_loop_count_are_a_crash_loop():
    loops = conventions.CRASH_LOOP_RESTARTS
    sigterm = [{"kind": "end", "rank": 0, "how": "sigterm", "step": 6, "time": 106.5}]
    assert [i.cause for i in restarted(loops, sigterm)] == ["crash_loop"]
    assert [i.cause for i in restarted(loops - 1, sigterm)] == ["rank_missing"]


def test_a_restart_s_evidence_culprit_and_cost():
    sigterm = [{"kind": "end", "rank": 0, "how": "sigterm", "step": 6, "time": 106.5}]
    restore = {"kind": "restore", "rank": 1, "time": 115.0, "step": 6, "seconds": 0.5}
    (one,) = restarted(1, sigterm, restore)
    # restored from the last step: nothing made again; the restart 106 -> 120 less the restore
    assert (one.rank, one.start, one.end, one.lost_gpu_seconds) == (1, 106.0, 120.0, 27.0)
    assert one.evidence[-1] == "restarted (restart 1) after step 6; resumed at step 6"
    assert one.evidence[0].startswith("rank 1 died without exiting"), one.evidence
    # both killed: no one culprit; the time from the last step to the first step again
    (both,) = restarted(1, [])
    assert (both.rank, both.lost_gpu_seconds) == (None, 2 * 14.0), both
    assert both.evidence[-1] == "restarted (restart 1) after step 6; resumed at step 0"
    # a restart record without its count: restart 0
    (untold,) = restarted(0, sigterm)
    assert "(restart 0)" in untold.evidence[-1], untold.evidence


def test_a_restarted_life_without_a_step_is_no_restart_yet():
    assert restarted(1, [], second_steps=False) == []


# ---- lemon nodes ----------------------------------------------------------------------------

def test_lemon_nodes_order_by_runs_then_cost_then_name():
    def at(node: str, run: str, lost: float = 10.0) -> Incident:
        return Incident(0, 1, "hang", 0, "", node, "", (), lost, run=run)
    found_ = [at("c", "r1", 50.0), at("c", "r2", 50.0), at("b", "r1"), at("b", "r2"),
              at("a", "r1"), at("a", "r2"), at("d", "r1"), at("d", "r2"), at("d", "r3")]
    assert lemon_nodes(found_) == [("d", 3, 30.0), ("c", 2, 100.0), ("a", 2, 20.0),
                                   ("b", 2, 20.0)], lemon_nodes(found_)
    assert lemon_nodes([at("a", "r1")]) == [], "one run is not a pattern"
