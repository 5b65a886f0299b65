"""A run's wall-clock time split into productive time and badput by cause (``fsdpmon
goodput``), from its JSONL alone.

Wall: the first process start (incarnation 0) to the last step record. Then:

- ``startup``: process start to the first step's begin, less a restore before it;
- per log window, the job's split (``fsdpmon.job.goodput.split_window``): productive,
  ``data_wait``, ``straggler_wait`` (given the judge's replay, only where it named the
  window's critical rank a straggler) and ``stall`` (a stall's seconds from its end record);
- ``checkpoint_save``: each save's wall time (the slowest rank's), saves inside the wall;
- ``checkpoint_restore``: each restore's time (the slowest rank's);
- ``restart``: from the last step of an incarnation to the first step's begin of the next,
  less its restore and the saves in between (counted as saves);
- ``recompute``: the productive time of the steps after the restored checkpoint, made again
  after the restart: moved out of productive;
- ``unaccounted``: the rest (the time between steps outside any phase: log steps, hooks).

So the parts sum to the wall exactly; each category is also attributed to the rank (and its
node) the time was lost to, where a cause has one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from fsdpmon.job.goodput import CATEGORIES, RankWindow, WindowSplit, holds_stall, split_window
from fsdpmon.job.runlog import Incarnation, RunLog, number


@dataclass
class Goodput:
    run: str
    wall_seconds: float = 0.0
    productive_seconds: float = 0.0
    badput_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES,
                                                                                   0.0))
    by_rank: dict[str, dict[int, float]] = field(default_factory=dict)  # cause -> rank -> s
    windows: list[tuple[int, int, WindowSplit]] = field(default_factory=list)  # (inc, step, _)

    @property
    def goodput_ratio(self) -> float | None:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else None

    def add(self, cause: str, seconds: float, rank: int | None = None) -> None:
        self.badput_seconds[cause] += seconds
        if rank is not None and seconds > 0:
            ranks = self.by_rank.setdefault(cause, {})
            ranks[rank] = ranks.get(rank, 0.0) + seconds

    def as_json(self) -> dict[str, Any]:
        return {"wall_seconds": self.wall_seconds, "productive_seconds": self.productive_seconds,
                "goodput_ratio": self.goodput_ratio, "badput_seconds": dict(self.badput_seconds)}


# (incarnation, log step) -> the ranks the judge named stragglers then
Named = Callable[[Incarnation, int], Collection[int]]


def window_of(record: dict[str, Any], rank: int) -> RankWindow | None:
    values = [number(record.get(k)) for k in ("step_seconds", "data_seconds", "wait_seconds",
                                              "steps")]
    if any(v is None for v in values):
        return None
    step, data, wait, steps = (v or 0.0 for v in values)
    return RankWindow(rank, int(steps), step, data, wait)


def _stall_seconds(inc: Incarnation) -> dict[int, float]:
    """Step -> a stall's lost seconds that ended at it (the most any rank measured)."""
    out: dict[int, float] = {}
    for rec in inc.of_kind("stall"):
        seconds, step = number(rec.get("seconds")), number(rec.get("step"))
        if rec.get("state") == "end" and rec.get("during") == "step" and seconds and step:
            out[int(step)] = max(out.get(int(step), 0.0), seconds)
    return out


def _to_the_window_that_holds_it(stalls: dict[int, float],
                                 by_step: dict[int, list[RankWindow]]) -> None:
    """A stall's end is told at the step in which the watchdog saw progress again, which may be
    the step after the one a stopped rank spent it in (rank 1 stopped in its step 23, rank 0
    waiting in the log gather after its own, the end seen during step 24: seen in the suite).
    Such a stall moves to the window before, where a rank's own work holds it, if that window
    holds no stall of its own."""
    for step, seconds in sorted(stalls.items()):
        before = step - 1
        if before not in stalls \
                and any(holds_stall(w, seconds) for w in by_step.get(before, ())) \
                and not any(holds_stall(w, seconds) for w in by_step.get(step, ())):
            stalls[before] = stalls.pop(step)


def _windows(inc: Incarnation, gp: Goodput, named: Named | None) -> None:
    """Add the incarnation's step windows."""
    by_step: dict[int, list[RankWindow]] = {}
    walls: dict[int, float] = {}  # the window's wall seconds (least over ranks)
    for rank, records in inc.steps.items():
        for rec in records:
            window = window_of(rec, rank)
            if window is not None:
                step = int(rec["step"])
                by_step.setdefault(step, []).append(window)
                wall = number(rec.get("window_seconds")) or 0.0
                walls[step] = min(walls.get(step, wall), wall)
    stalls = _stall_seconds(inc)
    _to_the_window_that_holds_it(stalls, by_step)
    for step in sorted(by_step):
        split = split_window(by_step[step], stalls.get(step, 0.0), walls[step],
                             named(inc, step) if named is not None else None)
        if split is None:
            continue
        gp.windows.append((inc.index, step, split))
        gp.productive_seconds += split.productive
        gp.add("data_wait", split.data_wait, split.critical_rank)
        gp.add("straggler_wait", split.straggler_wait, split.critical_rank)
        gp.add("stall", split.stall)


def saves(inc: Incarnation, until: float) -> list[dict[str, Any]]:
    """The incarnation's saves (one per step: the slowest rank's wall, the rank with the most
    own time), those ended by ``until``."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for rec in inc.of_kind("checkpoint"):
        if number(rec.get("seconds")) is not None and number(rec.get("step")) is not None:
            by_step.setdefault(int(rec["step"]), []).append(rec)
    out = []
    for step, recs in sorted(by_step.items()):
        wall = max(recs, key=lambda r: r["seconds"])
        own = max(recs, key=lambda r: number(r.get("own_seconds")) or 0.0)
        if wall["time"] <= until:
            out.append({"step": step, "time": wall["time"], "seconds": wall["seconds"],
                        "rank": own["rank"], "own_seconds": number(own.get("own_seconds"))})
    return out


def restore_of(inc: Incarnation) -> tuple[int, float]:
    """(restored step, seconds) of the incarnation's restore; (0, 0) when it started afresh."""
    recs = [r for r in inc.of_kind("restore") if number(r.get("seconds")) is not None]
    if not recs:
        return 0, 0.0
    return int(number(recs[0].get("step")) or 0), max(r["seconds"] for r in recs)


def endings(prev: Incarnation, nxt: Incarnation) -> dict[int, tuple[str, int | None]]:
    """rank -> (how, step) of how each rank's process in ``prev`` ended: as the restarted
    process read its exit record ("exit" records), else from ``prev``'s own "end" records, a
    rank without one having been killed outright."""
    said = {int(r["rank"]): (str(r.get("how")), int(number(r.get("step")) or 0))
            for r in nxt.of_kind("exit")}
    if said:
        return said
    ended = {int(r["rank"]): (str(r.get("how")), int(number(r.get("step")) or 0))
             for r in prev.of_kind("end")}
    last = {rank: int(recs[-1]["step"]) for rank, recs in prev.steps.items() if recs}
    return {rank: ended.get(rank, ("killed", last.get(rank))) for rank in prev.runs}


def killed_ranks(prev: Incarnation, nxt: Incarnation) -> list[int]:
    return sorted(r for r, (how, _) in endings(prev, nxt).items() if how == "killed")


def goodput(run: RunLog, named: Named | None = None) -> Goodput:
    """The run's split. ``named``: (incarnation, log step) -> the ranks the judge named
    stragglers then (fsdpmon.diagnose.replay.run_stragglers), the only ones charged straggler
    time; None: each window's own figures against the judge's line, as the monitor's live
    meter charges it."""
    gp = Goodput(run.name)
    live = [inc for inc in run.incarnations if inc.last_step is not None]
    if not live:
        return gp
    start = run.incarnations[0].process_start or live[0].first_begin() or 0.0
    end = live[-1].last_step[0]  # type: ignore[index]
    gp.wall_seconds = max(0.0, end - start)
    previous: Incarnation | None = None
    for inc in live:
        restored_step, restore = restore_of(inc)
        gp.add("checkpoint_restore", restore)
        begin = inc.first_begin() or start
        if previous is None:
            gp.add("startup", max(0.0, begin - start - restore))
        else:
            prev = previous
            last_time = prev.last_step[0]  # type: ignore[index]
            between = sum(s["seconds"] for s in saves(prev, end) if s["time"] > last_time)
            killed = killed_ranks(prev, inc)
            culprit = killed[0] if len(killed) == 1 else None
            gp.add("restart", max(0.0, begin - last_time - restore - between), culprit)
            # the steps after the restored checkpoint were made twice: what they were
            # credited as productive the first time is lost
            lost = sum(s.productive for i, step, s in gp.windows
                       if i == prev.index and step > restored_step)
            gp.add("recompute", lost, culprit)
            gp.productive_seconds -= lost
        for save in saves(inc, end):
            gp.add("checkpoint_save", save["seconds"], save["rank"])
        _windows(inc, gp, named)
        previous = inc
    gp.badput_seconds["unaccounted"] = 0.0
    gp.badput_seconds["unaccounted"] = (gp.wall_seconds - gp.productive_seconds
                                        - sum(gp.badput_seconds.values()))
    return gp
