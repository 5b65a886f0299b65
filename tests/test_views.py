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
from top_snapshots import T0, ranks, results, snapshot

from fsdpmon.top import fmt
from fsdpmon.top.aggregate import aggregate
from fsdpmon.top.snapshot import JobSnapshot
from fsdpmon.top.synthetic import job_expositions
from fsdpmon.top.ui_state import ViewState
from fsdpmon.top.views import frame, once_frame

GOLDEN = Path(__file__).parent / "golden" / "top"


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
    start = next(i for i, line in enumerate(lines) if line.startswith("RANK"))
    return [line for line in lines[start + 1:] if line.strip() and " · sorted by " not in line]


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
    snap = snapshot(ranks(r2={"step_time_s": 0.9}))
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
    from fsdpmon.top.aggregate import WANTED, ScrapeResult, Target
    from fsdpmon.top.expfmt import Parser

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
    assert fmt.si(16400) == "16.4k" and fmt.si(None) == "-" and fmt.si(float("nan")) == "-"
    assert fmt.size(40 * 2**30) == "40.0G" and fmt.duration(450) == "7m30s"
    assert fmt.duration(3 * 86400 + 4 * 3600) == "3d04h" and fmt.seconds(12.34) == "12.3s"
    assert fmt.sparkline([1, 2, 3, 4, 5, 6, 7, 8], 8) == "▁▂▃▄▅▆▇█"
    assert fmt.sparkline([5, 5], 8) == "▄▄" and fmt.sparkline([], 4) == ""
    assert fmt.bar(0.5, 12, "green").plain == "[|||||     ]"
