"""Whatever a pod serves, parsing, aggregation and every view keep working (hypothesis)."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from fsdpmon.diagnose import judge
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.wanted import WANTED
from fsdpmon.top.cli import snapshot_json
from fsdpmon.top.ui_state import VIEWS, ViewState
from fsdpmon.top.views import frame, once_frame

LABELS = ("job_name", "rank", "local_rank", "node", "gpu", "pid", "pod", "command", "cpu",
          "world_size", "model", "state", "uuid", "simulated", "le")
# the label sets real series carry, so that most hostile values reach the aggregation
REAL_LABEL_SETS = [
    ["job_name", "rank", "local_rank"],
    ["job_name", "rank", "local_rank", "node", "world_size", "model"],
    ["job_name"],
    ["gpu", "uuid", "model", "node", "pod"],
    ["node", "pid", "pod", "command", "state"],
    ["node", "cpu"],
    ["node", "simulated"],
]
VALUES = st.one_of(st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "-0", "x", "1", "0", "5"]),
                   st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20))
LABEL_VALUES = st.one_of(st.sampled_from(["0", "1", "-1", "99999999999999999999", "all", "",
                                          "[/bold]", "node-0", "1.5", "true"]),
                         st.text(max_size=12))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition_lines(draw) -> str:
    name = draw(st.sampled_from(sorted(WANTED)))
    keys = draw(st.one_of(st.sampled_from(REAL_LABEL_SETS),
                          st.lists(st.sampled_from(LABELS), max_size=6, unique=True)))
    labels = ",".join(f'{k}="{_escape(draw(LABEL_VALUES))}"' for k in keys)
    return f"{name}{{{labels}}} {draw(VALUES)}"


def _render(snap) -> None:
    verdict = judge([snap])  # what the pods served, judged at a glance
    for view in VIEWS:
        console = Console(width=80, height=24, file=io.StringIO(), color_system=None)
        console.print(frame(snap, ViewState(view=view), 24, verdict=verdict))
    Console(width=80, file=io.StringIO()).print(once_frame(snap, verdict))
    snapshot_json(snap, verdict)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(exposition_lines(), max_size=30), min_size=1, max_size=3))
def test_hostile_samples_never_crash_aggregation_or_views(bodies):
    parser = Parser(WANTED)
    snap = None
    for _ in range(2):  # a second refresh exercises history and carried-over rows
        results = [ScrapeResult(Target(f"http://10.0.0.{i}:9520/metrics"),
                                parser.parse("\n".join(lines) + "\n"))
                   for i, lines in enumerate(bodies)]
        results.append(ScrapeResult(Target("http://10.0.0.99:9520/metrics"), None, "timed out"))
        snap = aggregate(results, now=0.0, source="targets", previous=snap)
        _render(snap)
