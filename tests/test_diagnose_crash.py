"""The diagnosis of a rank that dies under torchrun's elastic agent, on built snapshots.

The agent stops every rank when one dies and restarts them all, so every rank vanishes at once:
which one died is only known from the restarted ranks' report of how their previous lives
ended (``fsdpmon_train_previous_exit``). Each phase is checked: all gone (no culprit can be told
yet, unless a previous restart said who keeps dying), back after the restart (the killed rank
named), the report gone stale (cleared), and restarts where nobody was killed (nobody named).
"""

from __future__ import annotations

import dataclasses

from top_snapshots import REFRESH_S, T0, diagnosis_history

from fsdpmon.conventions import CRASH_EVIDENCE_SECONDS, DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose import Finding, diagnose

WORLD = 4  # two pods of two ranks (top_snapshots' default job)
HEALTHY, DOWN = 6, 8  # refreshes before the crash, refreshes with every rank gone (16 s)
BACK = HEALTHY + DOWN  # the first refresh after the restart
STEP = 60


def _restarted(restarts: int, ended: dict[int, str], at: int) -> dict:
    """Every rank up again after ``restarts`` restarts, the last at refresh ``at``; ``ended``:
    how each rank's previous life ended."""
    return {"specs": {f"r{r}": {"restarts": restarts, "previous_exit": how,
                                "previous_exit_step": STEP + (how != "killed"),
                                "previous_exit_unix": T0 + REFRESH_S * at}
                      for r, how in ended.items()}}


def crash(ended: dict[int, str], n: int, restarts_before: int = 0,
          before: dict[int, str] | None = None) -> list:
    """Healthy (after ``restarts_before`` restarts, ``before`` saying how those ended), every
    rank gone for DOWN refreshes, then back with one restart more."""
    def at(i: int) -> dict:
        if i < HEALTHY:
            return _restarted(restarts_before, before or {}, 0) if restarts_before else {}
        if i < BACK:
            return {**(_restarted(restarts_before, before or {}, 0) if restarts_before else {}),
                    "down": (0, 1)}
        return _restarted(restarts_before + 1, ended, BACK)
    return diagnosis_history(at, n)


def crashes(findings: list[Finding]) -> list[tuple[str, int | None]]:
    return [(f.cause, f.rank) for f in findings if f.cause in ("rank_missing", "crash_loop")]


KILLED_1 = {0: "sigterm", 1: "killed", 2: "sigterm", 3: "error"}


def test_every_rank_gone_at_once_names_no_rank_before_the_restart():
    """An older rule named the smallest rank (0) of the tie: a false culprit. Until a restarted
    rank says, what is known is the pods' endpoints down with their ranks (as the page has it:
    no series of a rank is left to count)."""
    snaps = crash(KILLED_1, BACK)
    assert snaps[-1].time - snaps[HEALTHY].time >= DIAGNOSIS_EVIDENCE_SECONDS
    found = diagnose(snaps)
    assert crashes(found) == [], found
    pods = sorted((f.pod, f.rank, f.evidence[1]) for f in found if f.cause == "target_down"
                  and f.pod.startswith("llama-worker"))
    assert pods == [
        (f"llama-worker-{n}", None, f"it served ranks {2 * n}, {2 * n + 1}, silent with it: "
         "which rank died first, its restarted process will say") for n in (0, 1)], found


def test_the_killed_rank_is_named_once_the_ranks_are_back():
    snaps = crash(KILLED_1, BACK + 1)
    found = diagnose(snaps)
    assert crashes(found) == [("rank_missing", 1)], found
    f = found[0]
    assert (f.pod, f.node) == ("llama-worker-0", "node-0"), f
    assert f.evidence[:3] == (
        f"rank 1 died without exiting (killed: SIGKILL, the OOM killer or a segfault) after "
        f"step {STEP} (its last log step)",
        f"ranks 0, 2 stopped by a signal (the agent's SIGTERM) after step {STEP + 1}",
        f"rank 3 exited on an error after step {STEP + 1}"), f.evidence
    assert "restarted every rank (0 → 1 restarts)" in f.evidence[3], f.evidence


def test_the_finding_clears_when_the_report_is_no_longer_recent():
    last = BACK + int(CRASH_EVIDENCE_SECONDS // REFRESH_S)
    snaps = crash(KILLED_1, last + 2)
    assert crashes(diagnose(snaps[:last])) == [("rank_missing", 1)]
    age = snaps[-1].time - snaps[BACK].time
    assert age > CRASH_EVIDENCE_SECONDS, age
    assert diagnose(snaps) == [], f"{age - CRASH_EVIDENCE_SECONDS:.0f}s past the evidence"


def test_a_restart_nobody_was_killed_in_names_nobody():
    """A restart after a normal finish, a SIGTERM to torchrun, or errors on several ranks (each
    may be another's casualty): no culprit."""
    for ended in ({r: "sigterm" for r in range(WORLD)}, {r: "exit" for r in range(WORLD)},
                  {0: "error", 1: "error", 2: "sigterm", 3: "sigterm"}, {0: "error", 1: "error"},
                  {0: "error", 1: "exit", 2: "sigterm", 3: "sigterm"}):
        found = diagnose(crash(ended, BACK + 1))
        assert found == [], (ended, found)


def test_the_one_rank_that_failed_on_an_error_is_named_when_the_agent_stopped_the_rest():
    """A Python exception on rank 2 alone, the others stopped by the agent's SIGTERM: the agent
    stops the others only once a worker failed, so rank 2 brought the group down."""
    found = diagnose(crash({0: "sigterm", 1: "sigterm", 2: "error", 3: "sigterm"}, BACK + 1))
    assert crashes(found) == [("rank_missing", 2)], found
    assert found[0].summary == "rank 2 failed (an error); the job restarted", found[0].summary
    assert found[0].evidence[0].startswith("ranks 0, 1, 3 stopped by a signal"), found[0].evidence


def test_a_crash_loop_names_the_rank_that_keeps_dying():
    """The second crash: while every rank is gone, the first restart's report already names
    rank 1; after the second restart, two restarts in view make it a crash loop."""
    snaps = crash(KILLED_1, BACK, restarts_before=1, before=KILLED_1)
    found = [f for f in diagnose(snaps) if f.cause in ("rank_missing", "crash_loop")]
    assert [(f.rank, f.summary) for f in found] == [(1, "rank 1 missing")], found
    assert any(e.startswith("at the last restart: rank 1 died without exiting")
               for e in found[0].evidence), found[0].evidence
    early = crash(KILLED_1, HEALTHY, restarts_before=0)  # restarts 0 seen, then 1, then 2
    loop = early + [s for s in crash(KILLED_1, BACK + 1, restarts_before=1, before=KILLED_1)
                    [HEALTHY:] if s.time > early[-1].time]
    found = diagnose(loop)
    assert crashes(found) == [("crash_loop", 1)], found
    assert found[0].evidence[0] == "job restarted 2 times (0 → 2)", found[0].evidence


def test_ranks_slow_to_come_back_are_not_the_culprit():
    """Pod 1 (ranks 2, 3) is still restarting 20 s after pod 0 is back: the old rule named
    rank 2, the first of the ranks still missing."""
    def at(i: int) -> dict:
        if i < HEALTHY:
            return {}
        if i < BACK:
            return {"down": (0, 1)}
        return {**_restarted(1, {0: "sigterm", 1: "killed"}, BACK), "down": (1,)}
    found = diagnose(diagnosis_history(at, BACK + 10))
    assert crashes(found) == [("rank_missing", 1)], found
    assert "ranks 2, 3 not back yet" in found[0].evidence, found[0].evidence
    # pod 1's training target is evidence (its exporter, down too here, is a target_down)
    assert not [f for f in found if f.cause == "target_down" and f.pod == "llama-worker-1"], found


def test_a_job_that_finished_names_nobody():
    """Every rank gone at once after its last step (a normal finish: top says DONE) is not a
    crash: no rank_missing (the old rule named rank 0), no training target down."""
    done = {f"r{r}": {"step": 1000, "total_steps": 1000} for r in range(WORLD)}
    snaps = diagnosis_history(lambda i: {"specs": done, "down": () if i < HEALTHY else (0, 1)},
                              BACK)
    assert snaps[-1].state.value == "DONE", snaps[-1].state
    found = diagnose(snaps)
    assert crashes(found) == [], found
    assert not [f for f in found if f.cause == "target_down" and "worker" in (f.pod or "")], found


def test_each_way_of_ending_is_one_line_with_its_ranks_and_steps():
    from fsdpmon.diagnose.exits import exit_evidence

    lines = exit_evidence({0: ("sigterm", 40), 1: ("sigterm", 45), 2: ("sigterm", 50),
                           3: ("killed", 60), 4: ("error", None)})
    assert lines == [
        "rank 3 died without exiting (killed: SIGKILL, the OOM killer or a segfault) after "
        "step 60 (its last log step)",
        "ranks 0, 1, 2 stopped by a signal (the agent's SIGTERM) after steps 40–50",
        "rank 4 exited on an error"], lines


def test_one_restart_after_an_earlier_one_is_no_crash_loop():
    """Restarts 1 → 2 in view: one restart, below CRASH_LOOP_RESTARTS (2), whatever came
    before the history; the refreshes while every rank was gone know no count (not 0: read as
    0, they made every restart after the first a crash loop)."""
    snaps = crash(KILLED_1, BACK + 1, restarts_before=1, before=KILLED_1)
    found = diagnose(snaps)
    assert crashes(found) == [("rank_missing", 1)], found
    assert "the elastic agent restarted every rank (1 → 2 restarts)" in found[0].evidence, found


def test_a_report_exactly_crash_evidence_seconds_old_still_counts():
    on_the_line = BACK + int(CRASH_EVIDENCE_SECONDS // REFRESH_S)
    snaps = crash(KILLED_1, on_the_line + 1)
    assert snaps[-1].time - snaps[BACK].time == CRASH_EVIDENCE_SECONDS
    assert crashes(diagnose(snaps)) == [("rank_missing", 1)]


def test_a_crash_loop_counts_the_restarts_it_saw():
    """Restarts 1 → 3 in view: two, as the evidence says."""
    early = crash(KILLED_1, HEALTHY, restarts_before=1, before=KILLED_1)
    loop = early + [s for s in crash(KILLED_1, BACK + 1, restarts_before=2, before=KILLED_1)
                    [HEALTHY:] if s.time > early[-1].time]
    found = diagnose(loop)
    assert crashes(found) == [("crash_loop", 1)], found
    assert found[0].evidence[0] == "job restarted 2 times (1 → 3)", found[0].evidence


def test_a_rank_never_seen_after_a_restart_is_evidence_of_it():
    """Back after the restart, but the world size says five ranks and only four came: the
    killed rank is named, the fifth is not back yet."""
    snaps = [dataclasses.replace(s, world_size=5) for s in crash(KILLED_1, BACK + 1)]
    found = diagnose(snaps)
    assert crashes(found) == [("rank_missing", 1)], found
    assert "rank 4 not back yet" in found[0].evidence, found[0].evidence
