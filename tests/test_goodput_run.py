"""A run's goodput from its records, fast: boundaries of ``fsdpmon.job.run_goodput`` pinned
with a case on each side (benchmarks/mutation.py). Runs are built in memory; figures are binary
fractions, so the sums are exact and so are the comparisons."""

from __future__ import annotations

from fsdpmon.job.goodput import CATEGORIES
from fsdpmon.job.run_goodput import Goodput, endings, goodput
from fsdpmon.job.runlog import Incarnation, RunLog


def step(rank: int, n: int, end: float, seconds: float, window: float | None = None,
         wait: float = 0.0) -> dict:
    rec = {"kind": "step", "time": end, "rank": rank, "step": n, "step_seconds": seconds,
           "data_seconds": 0.0, "wait_seconds": wait, "steps": 1}
    if window is not None:
        rec["window_seconds"] = window
    return rec


def life(index: int, start: float | None, steps: dict[int, list[dict]],
         events: list[dict] = ()) -> Incarnation:
    runs = {r: {"kind": "run", "rank": r} | ({} if start is None else {"process_start": start})
            for r in steps}
    return Incarnation(index, runs, steps, list(events))


def run_of(*lives: Incarnation) -> RunLog:
    return RunLog("hand", "hand", {}, list(lives))


def bad(gp: Goodput) -> dict[str, float]:
    return {k: v for k, v in gp.badput_seconds.items() if v}


def test_a_run_without_steps_has_no_figures():
    gp = goodput(run_of(life(0, 100.0, {0: []})))
    assert gp.as_json() == {"wall_seconds": 0.0, "productive_seconds": 0.0,
                            "goodput_ratio": None,
                            "badput_seconds": dict.fromkeys(CATEGORIES, 0.0)}, gp.as_json()
    assert Goodput("x", wall_seconds=0.5, productive_seconds=0.25).goodput_ratio == 0.5


def test_a_run_under_a_second_keeps_its_startup_under_a_second():
    gp = goodput(run_of(life(0, 100.0, {0: [step(0, 1, 100.75, 0.25, 0.25)]})))
    assert (gp.wall_seconds, gp.productive_seconds) == (0.75, 0.25), gp.as_json()
    assert bad(gp) == {"startup": 0.5}, bad(gp)


def test_without_a_process_start_the_wall_counts_from_the_first_step_s_begin():
    gp = goodput(run_of(life(0, None, {0: [step(0, 1, 1.0, 1.0, 1.0)]})))
    assert (gp.wall_seconds, gp.productive_seconds) == (1.0, 1.0), gp.as_json()


def test_a_save_is_the_slowest_rank_s_wall_named_for_the_rank_with_most_own_time():
    steps = {r: [step(r, 1, 101.0, 1.0, 1.0), step(r, 2, 102.5, 1.0, 1.5)] for r in (0, 1)}
    events = [
        # step 1's save: rank 0 waited 0.5 s (no own time told), rank 1 wrote 0.125 s of it
        {"kind": "checkpoint", "rank": 0, "time": 101.5, "step": 1, "seconds": 0.5},
        {"kind": "checkpoint", "rank": 1, "time": 101.5, "step": 1, "seconds": 0.25,
         "own_seconds": 0.125},
        # step 2's save ends as the last step record is written: still inside the wall
        {"kind": "checkpoint", "rank": 0, "time": 102.5, "step": 2, "seconds": 0.25,
         "own_seconds": 0.25},
        # records that lack a step or a duration are not saves
        {"kind": "checkpoint", "rank": 0, "time": 101.0, "seconds": 9.0},
        {"kind": "checkpoint", "rank": 0, "time": 101.0, "step": 1},
    ]
    gp = goodput(run_of(life(0, 100.0, steps, events)))
    assert gp.badput_seconds["checkpoint_save"] == 0.75, bad(gp)
    assert gp.by_rank == {"checkpoint_save": {1: 0.5, 0: 0.25}}, gp.by_rank


def stall(rank: int, n: int, seconds: float, state: str = "end", during: str = "step") -> dict:
    return {"kind": "stall", "state": state, "rank": rank, "step": n, "seconds": seconds,
            "during": during, "time": 0.0}


def test_stalls_come_from_their_end_records_during_steps_the_most_any_rank_lost():
    steps = {r: [step(r, 1, 101.0, 1.0, 1.0),
                 # rank 1 stopped in its log step: 5.0 s of the window outside its steps
                 step(r, 2, 106.25, 0.25, 5.25, wait=0.125 if r == 0 else 0.0),
                 step(r, 3, 106.5, 0.25)]  # no window told: no time between its steps
             for r in (0, 1)}
    events = [stall(0, 1, 0.5), stall(1, 1, 0.25),
              stall(1, 2, 6.0), stall(0, 2, 5.5),
              stall(1, 2, 9.0, state="start"), stall(1, 2, 9.0, during="checkpoint"),
              stall(0, 3, 2.0)]
    gp = goodput(run_of(life(0, 100.0, steps, events)))
    per_window = [(n, s.stall, s.stall_between) for _, n, s in gp.windows]
    # step 2: 6 s lost, 5 s of them between the steps, then at most its 0.25 s of step time
    assert per_window == [(1, 0.5, 0.0), (2, 5.25, 5.0), (3, 0.25, 0.0)], per_window
    assert gp.badput_seconds["stall"] == 6.0 and "stall" not in gp.by_rank, gp.by_rank


def stopped_in_its_step(own: float) -> list[tuple[int, float, float]]:
    """Seen in the suite: rank 1 stopped in its own work in step 23 (``own`` seconds of it),
    rank 0 waiting in the log gather after its step 23 (its window 24 holds the wait); the
    stall's end is told at step 24, 5.75 s by rank 0. Each window's (step, stall, critical
    rank)."""
    quick = 0.015625
    steps = {0: [step(0, 23, 106.0, quick, quick, wait=0.0078125),
                 step(0, 24, 106.25, quick, 6.0, wait=0.0078125)],
             1: [step(1, 23, 106.0, own + 0.0078125, 6.0, wait=0.0078125),
                 step(1, 24, 106.25, quick, quick, wait=0.0078125)]}
    gp = goodput(run_of(life(0, 99.0, steps, [stall(0, 24, 5.75), stall(1, 24, 0.0)])))
    return [(n, s.stall, s.critical_rank) for _, n, s in gp.windows]


def test_a_stall_told_at_the_next_step_goes_to_the_window_whose_own_work_holds_it():
    assert stopped_in_its_step(5.75) == [(23, 5.75, 1), (24, 0.0, 0)], stopped_in_its_step(5.75)
    # just short of it: rank 1 was not stopped that long in its step, the stall stays told
    short = stopped_in_its_step(5.75 - 0.0078125)
    assert [(n, stall) for n, stall, _ in short] == [(23, 0.0), (24, 0.015625)], short


def restarted(restore: dict | None) -> RunLog:
    """Life 0 (ranks 0 and 1): steps 1 and 2 of 1 s, a 0.25 s save in step 2's window ending
    as its record is written (102.0); rank 0 stopped on SIGTERM, rank 1 was killed. Life 1
    starts at 102.25 and its first step begins at 102.75."""
    first = {r: [step(r, 1, 100.75, 1.0, 1.0), step(r, 2, 102.0, 1.0, 1.25)] for r in (0, 1)}
    events = [{"kind": "checkpoint", "rank": 0, "time": 102.0, "step": 2, "seconds": 0.25},
              {"kind": "end", "rank": 0, "how": "sigterm", "time": 102.0}]
    later = [restore] if restore else []
    return run_of(life(0, 99.75, first, events),
                  life(1, 102.25, {r: [step(r, 3, 103.0, 0.25, 0.25)] for r in (0, 1)}, later))


def test_a_restart_after_a_fresh_start_makes_every_step_again():
    gp = goodput(restarted(None))
    assert gp.wall_seconds == 3.25 and gp.productive_seconds == 0.25, gp.as_json()
    # the save ended at the last step (not after it): no part of the restart
    assert bad(gp) == {"checkpoint_save": 0.25, "restart": 0.75, "recompute": 2.0}, bad(gp)
    assert gp.by_rank["restart"] == {1: 0.75} and gp.by_rank["recompute"] == {1: 2.0}


def test_a_restore_told_by_one_rank_alone_sets_what_is_made_again():
    gp = goodput(restarted({"kind": "restore", "rank": 1, "step": 1, "seconds": 0.25}))
    assert bad(gp) == {"checkpoint_save": 0.25, "checkpoint_restore": 0.25, "restart": 0.5,
                       "recompute": 1.0}, bad(gp)
    unnumbered = goodput(restarted({"kind": "restore", "rank": 1, "seconds": 0.25}))
    assert unnumbered.badput_seconds["recompute"] == 2.0, "a restore of no known step: all"


def test_endings_without_a_step_say_step_zero():
    prev = life(0, 0.0, {0: [step(0, 4, 1.0, 1.0)], 1: [step(1, 4, 1.0, 1.0)]},
                [{"kind": "end", "rank": 0, "how": "sigterm"}])
    nxt = life(1, 5.0, {0: []})
    assert endings(prev, nxt) == {0: ("sigterm", 0), 1: ("killed", 4)}
    nxt.events.append({"kind": "exit", "rank": 1, "how": "killed"})
    assert endings(prev, nxt) == {1: ("killed", 0)}


def test_a_first_life_s_restore_and_a_save_after_the_last_step_are_no_startup_or_restart():
    """Life 0 starts at 100 from a checkpoint (0.25 s restore), first step begins 101; steps 3
    and 4; a 0.5 s save after step 4 (103.5), then it dies. Life 1 starts at 104, restores
    step 4 (0.25 s), its first step begins 105."""
    first = life(0, 100.0, {0: [step(0, 3, 102.0, 1.0, 1.0), step(0, 4, 103.0, 1.0, 1.0)]},
                 [{"kind": "restore", "rank": 0, "time": 100.5, "step": 2, "seconds": 0.25},
                  {"kind": "checkpoint", "rank": 0, "time": 103.5, "step": 4, "seconds": 0.5}])
    second = life(1, 104.0, {0: [step(0, 5, 106.0, 1.0, 1.0)]},
                  [{"kind": "restore", "rank": 0, "time": 104.5, "step": 4, "seconds": 0.25}])
    gp = goodput(run_of(first, second))
    assert (gp.wall_seconds, gp.productive_seconds) == (6.0, 3.0), gp.as_json()
    assert bad(gp) == {"startup": 0.75, "checkpoint_save": 0.5, "checkpoint_restore": 0.5,
                       "restart": 1.25}, bad(gp)
