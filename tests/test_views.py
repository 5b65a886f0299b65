"""Views render fixed snapshots to a string console; the key layouts are compared exactly.

Regenerate the golden files after an intended layout change with
``FSDPMON_UPDATE_GOLDEN=1 pytest tests/test_views.py`` and review the diff.
"""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_job import job_expositions
from top_snapshots import T0, ranks, results, snapshot

from fsdpmon.diagnose import Verdict, judge
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import ScrapeResult, aggregate
from fsdpmon.top import fmt, views
from fsdpmon.top.ui_state import ENTER, ViewState, handle_key

GOLDEN = Path(__file__).parent / "golden" / "top"


# The screens as top draws them: with the verdict on what it shows (of one refresh here: the
# glance, as before the evidence window has passed).
def frame(snap: JobSnapshot, state: ViewState, height: int, notice: str = "",
          verdict: Verdict | None = None):
    return views.frame(snap, state, height, notice, verdict or judge([snap]))


def nav(snap: JobSnapshot, state: ViewState, height: int):
    return views.nav(snap, state, height, verdict=judge([snap]))


def shows_processes(snap: JobSnapshot, state: ViewState, height: int) -> bool:
    return views.shows_processes(snap, state, height, verdict=judge([snap]))


def once_frame(snap: JobSnapshot):
    return views.once_frame(snap, judge([snap]))


def render(renderable, width: int = 80, height: int = 24) -> str:
    console = Console(width=width, height=height, file=io.StringIO(), color_system=None,
                      force_terminal=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("FSDPMON_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"layout {name} changed; see {path}"


def _table_rows(text: str) -> list[str]:
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("RANK"))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip() or " · sorted by " in line:
            break
        rows.append(line.lstrip("▸ "))
    return rows


def _fits(text: str, width: int, height: int) -> None:
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= height, f"{len(lines)} lines > {height}"
    assert max(len(line) for line in lines) <= width


@pytest.mark.parametrize("view", ["ranks", "gpus", "processes", "help"])
def test_healthy_job_80x24(view):
    text = render(frame(snapshot(), ViewState(view=view), 24))
    _fits(text, 80, 24)
    check_golden(f"healthy_{view}_80x24", text)


def test_straggler_highlighted():
    snap = snapshot(ranks(r2={"step_time_s": 0.9, "straggler_score": 0.5}))
    text = render(frame(snap, ViewState(view="ranks", sort_key="step_time", descending=True), 24))
    check_golden("straggler_ranks", text)
    assert "DEGRADED" in text and "rank 2 straggles" in text
    assert _table_rows(text)[0].split()[0] == "2" and "SLOWEST" in _table_rows(text)[0]


def test_stalled_rank():
    text = render(frame(snapshot(ranks(r1={"stalled": True, "heartbeat_age_s": 61.0})),
                        ViewState(), 24))
    check_golden("stalled_ranks", text)
    assert "STALLED" in text.split("\n")[0] and "rank 1 stalled" in text


def test_pod_down():
    specs = ranks()
    before = aggregate(results(specs), now=T0, source="targets")
    after = aggregate(results(specs, down=(1,)), now=T0 + 2, source="targets", previous=before)
    text = render(frame(after, ViewState(), 24))
    check_golden("pod_down_ranks", text)
    assert "targets 2/4 up" in text and "DOWN" in text
    gpus = render(frame(after, ViewState(view="gpus"), 24))
    assert "1!" in gpus  # a lost GPU keeps its row, marked


def test_large_job_shows_summary_and_top_rows_only():
    payloads = job_expositions("big", 64, 8)
    from fsdpmon.scrape.aggregate import ScrapeResult, Target
    from fsdpmon.scrape.expfmt import Parser
    from fsdpmon.scrape.wanted import WANTED

    parser = Parser(WANTED)
    snap = aggregate([ScrapeResult(Target(f"http://h{p}"), parser.parse(b.decode()))
                      for p, b in payloads.items()], now=T0, source="targets")
    for view, what in (("ranks", "of 512 ranks"), ("gpus", "of 512 GPUs"),
                       ("processes", "of 512 processes")):
        text = render(frame(snap, ViewState(view=view), 24))
        _fits(text, 80, 24)
        assert what in text
    big = render(frame(snap, ViewState(), 50), width=160, height=50)
    _fits(big, 160, 50)
    assert "of 512 ranks" in big


def test_filter_and_sort_apply():
    snap = snapshot(ranks(3, 2))
    text = render(frame(snap, ViewState(filter="node-2"), 24))
    assert [r.split()[0] for r in _table_rows(text)] == ["4", "5"]
    assert "2 ranks · sorted by RANK ↑ · filter 'node-2'" in text
    desc = render(frame(snap, ViewState(sort_key="rank", descending=True), 24))
    assert _table_rows(desc)[0].split()[0] == "5"


def test_once_frame_and_empty_snapshot():
    text = render(once_frame(snapshot()), width=100, height=200)
    for title in ("Ranks", "GPUs", "Processes"):
        assert f"\n{title}\n" in text
    empty = JobSnapshot(time=T0, source="targets")
    text = render(frame(empty, ViewState(), 24))
    assert "DOWN" in text and "no ranks reported yet" in text
    logs = render(frame(replace(empty, log_pod="p-0", logs=("step 1 loss 2.5",)),
                        ViewState(view="logs"), 24))
    assert "logs of p-0" in logs and "step 1 loss 2.5" in logs


def test_untrusted_text_is_not_markup():
    base = snapshot()
    hostile = "[/bold] python -c '[red]x[/red]' [link=file:///etc]"
    procs = tuple(replace(p, command=hostile, pod="[bold]pod") for p in base.processes)
    gpus = tuple(replace(g, pod="[/]gpu-pod", node="[blink]n") for g in base.gpus)
    ranks_ = tuple(replace(r, pod="[/x]") for r in base.ranks)
    snap = replace(base, processes=procs, gpus=gpus, ranks=ranks_, job_name="[/]job",
                   logs=("[/red] log line",), log_pod="[b]p")
    for view in ("ranks", "gpus", "processes", "logs"):
        text = render(frame(snap, ViewState(view=view), 40), width=160, height=40)
        assert "[/" in text or "[b" in text


def test_formatters():
    assert fmt.si(16400) == "16.4k" and fmt.si(None) == "-"
    # NaN and the infinities are shown as such (a diverging run), a missing figure as "-"
    assert [fmt.fixed(float(v)) for v in ("nan", "inf", "-inf")] == ["NaN", "+Inf", "-Inf"]
    assert fmt.si(float("nan")) == "NaN" and fmt.pct(float("inf")) == "+Inf"
    assert fmt.sparkline([1e308, -1e308, 0.0], 3) == "█▁▄"  # a span past the float range
    assert fmt.size(40 * 2**30) == "40.0G" and fmt.duration(450) == "7m30s"
    assert fmt.duration(3 * 86400 + 4 * 3600) == "3d04h" and fmt.seconds(12.34) == "12.3s"
    assert fmt.sparkline([1, 2, 3, 4, 5, 6, 7, 8], 8) == "▁▂▃▄▅▆▇█"
    assert fmt.sparkline([5, 5], 8) == "▄▄" and fmt.sparkline([], 4) == ""
    assert fmt.bar(0.5, 12, "green").plain == "[|||||     ]"


def _press(snap: JobSnapshot, keys: list[str], height: int = 24) -> ViewState:
    state = ViewState()
    for key in keys:
        state = handle_key(state, key, nav(snap, state, height))
    return state


def _with_log(snap: JobSnapshot) -> JobSnapshot:
    return replace(snap, log_pod="llama-worker-0", logs=(
        "12:00:01 [rank0] INFO trainer: step 99", "12:00:01 [rank1] INFO trainer: step 99",
        "step 100/1000 | loss 2.4900"))


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_drill_down_screens(size):
    width, height = size
    snap = _with_log(snapshot())
    screens = {"rank": ["j", ENTER], "process": ["j", ENTER, ENTER],
               "gpu": ["2", "j", "j", ENTER]}
    for name, keys in screens.items():
        state = _press(snap, keys, height)
        text = render(frame(snap, state, height), width, height)
        _fits(text, width, height)
        check_golden(f"drill_{name}_{width}x{height}", text)
    rank = render(frame(snap, _press(snap, screens["rank"], height), height), width, height)
    assert "rank 1  pod llama-worker-0" in rank and "step 99" in rank, rank
    gpu = render(frame(snap, _press(snap, screens["gpu"], height), height), width, height)
    assert "GPU 0 on node-1" in gpu and "serves rank 2" in gpu and "4002" in gpu, gpu


def test_selection_scrolls_and_says_what_is_off_screen():
    payloads = job_expositions("big", 8, 8)
    from fsdpmon.scrape.aggregate import ScrapeResult, Target
    from fsdpmon.scrape.expfmt import Parser
    from fsdpmon.scrape.wanted import WANTED

    parser = Parser(WANTED)
    snap = aggregate([ScrapeResult(Target(f"http://h{p}"), parser.parse(b.decode()))
                      for p, b in payloads.items()], now=T0, source="targets")
    state = _press(snap, ["\x1b[6~", "\x1b[6~", "j"])
    text = render(frame(snap, state, 24))
    page = nav(snap, state, 24).page
    marked = [line for line in text.split("\n") if "▸" in line]
    assert len(marked) == 1 and marked[0].split()[0] == f"▸{2 * page + 1}", marked
    shown_from = 2 * page + 2 - page + 1  # the selection is the last row on screen
    assert (f"{shown_from}-{2 * page + 2} of 64 ranks · {shown_from - 1} above · "
            f"{64 - 2 * page - 2} below") in text, text
    end = render(frame(snap, _press(snap, ["G"]), 24))
    assert f"{64 - page + 1}-64 of 64 ranks · {64 - page} above ·" in end and "below" not in end


def test_wide_screen_shows_ranks_gpus_and_processes_of_a_small_job():
    text = render(frame(snapshot(), ViewState(), 50), 200, 50)
    check_golden("healthy_ranks_200x50", text)
    assert "4 ranks" in text and "4 GPUs ·" in text and "4 processes" in text


@pytest.mark.parametrize(("view", "height", "shown"), [
    ("ranks", 50, True),  # room below the ranks for the GPUs and the processes tables
    ("ranks", 22, True),  # one process row fits
    ("ranks", 20, False), ("ranks", 14, False),  # the ranks and the GPUs, the ranks alone
    ("gpus", 50, False), ("processes", 24, True), ("rank", 24, True), ("help", 50, False),
])
def test_a_screen_says_whether_it_shows_process_figures(view, height, shown):
    """What tells the sources to fetch the process families every refresh (not every 5th):
    every screen that draws a process table, and only those."""
    snap = snapshot()
    state = ViewState(view=view, subject="0" if view == "rank" else "")
    assert shows_processes(snap, state, height) is shown, (view, height)
    assert ("4 processes" in render(frame(snap, state, height), 200, height)) is (
        view in ("ranks", "processes") and shown), "the table on screen and the answer differ"


def test_one_of_a_kind_is_not_plural():
    snap = snapshot(ranks(1, 1), per_node=1)
    text = render(frame(snap, ViewState(), 24))
    assert "1 rank ·" in text and "1 ranks" not in text and "1 GPU (SIMULATED)" in text, text


def _ended(kind: str) -> JobSnapshot:
    """A job seen running, then DONE (every rank at its last step, then gone), FAILED (gone at
    step 100 of 1000) or RESTARTING (restart count up, one pod's ranks not back yet)."""
    specs = ranks()
    if kind == "done":
        specs = [replace(s, step=1000) for s in specs]
    before = aggregate(results(specs), now=T0, source="targets")
    if kind == "restarting":
        again = [replace(s, restarts=1, step=90) for s in specs]
        return aggregate(results(again, down=(1,)), now=T0 + 2, source="targets",
                         previous=before)
    # the training endpoints go away; the exporters on the nodes stay
    gone = [ScrapeResult(r.target, None, "connection refused") if ":9520/" in r.target.url
            else r for r in results(specs)]
    return aggregate(gone, now=T0 + 2, source="targets", previous=before)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
@pytest.mark.parametrize("kind", ["done", "failed", "restarting"])
def test_ended_and_restarting_jobs(kind, size):
    width, height = size
    snap = _ended(kind)
    assert snap.state.value == kind.upper(), snap.state
    text = render(frame(snap, ViewState(), height), width, height)
    _fits(text, width, height)
    check_golden(f"{kind}_{width}x{height}", text)
    title = text.split("\n")[0]
    assert f" {kind.upper()} " in title, title
    if kind == "done":
        assert "not reporting" not in text and "gone before" not in text, text
    if kind == "failed":
        assert "rank 0, 1, 2, 3 gone before the last step (last seen at step 100/1000)" in text
    if kind == "restarting":
        assert "restarts 1" in text, text


def test_header_lines_are_never_cut_mid_word():
    from fsdpmon.top.fitted import cut_at_word

    alert = "4 of 4 targets down: llama-worker-0, fsdpmon-exporter-0, llama-worker-1"
    assert cut_at_word(alert, 80) == alert
    assert cut_at_word(alert, 60) == "4 of 4 targets down: llama-worker-0, fsdpmon-exporter-0…"
    snap = replace(snapshot(), time=T0 + 3600 * 13 + 60 * 14 + 15)
    for width in (60, 70, 80):
        title = render(frame(snap, ViewState(), 24), width).split("\n")[0]
        # the clock, like every header part, is there whole or not at all
        assert "13:14:15Z" in title or ":" not in title.replace("job", ""), title
        assert "…" not in title, title


def test_rows_sort_by_the_column_stably_with_unknown_values_last():
    """Rows with equal values keep their order either way; rows without one come last."""
    from fsdpmon.top.tables import select_rows

    specs = ranks(3, 2, r1={"step_time_s": 0.7}, r2={"step_time_s": 0.7},
                  r4={"step_time_s": 0.7})
    snap = snapshot(specs, refreshes=1)
    rows = [replace(r, step_time_s=None) if r.rank == 3 else r for r in snap.ranks]
    for descending, order in ((True, [1, 2, 4, 5, 0, 3]), (False, [0, 5, 1, 2, 4, 3])):
        state = ViewState(view="ranks", sort_key="step_time", descending=descending)
        got = [r.rank for r in select_rows(rows, "ranks", state)]
        assert got == order, f"descending={descending}: {got} != {order}"


def test_the_table_shows_the_selected_row_far_down_the_list():
    from fsdpmon.top.tables import table_of

    snap = snapshot(ranks(20, 5), refreshes=1)  # 100 ranks
    state = ViewState(view="ranks", sort_key="rank", descending=False, selected="73",
                      cursor=2)
    text = render(table_of(list(snap.ranks), "ranks", state, 10, current="73"), width=120)
    marked = [line.split()[0] for line in text.splitlines() if "▸" in line]
    assert marked == ["▸73"], f"marked: {marked}\n{text}"


def test_fewer_ranks_left_by_a_filter_leave_room_for_the_processes():
    """At a height where the four ranks leave no room for the processes table, a filter that
    leaves two of them does: the answer follows the rows on screen, not all the ranks."""
    snap = snapshot()
    for needle, shown in (("", False), ("node-0", True)):
        state = ViewState(view="ranks", filter=needle)
        text = render(frame(snap, state, 20), 200, 20)
        assert shows_processes(snap, state, 20) is shown, (needle, text)
        assert ("4 processes" in text) is shown, (needle, text)
