"""No value breaks a reader: NaN, +Inf and -Inf (and huge or negative figures) in any series.

A diverging run is exactly when people open `top`. Property tests over every numeric field:
of the aggregate (every value top reads from the pods and exporters), and of the snapshot
itself (every float and int field of every row). Each drawn snapshot is rendered in every
view, written as JSON, judged at a glance and for its state, and diagnosed; none of it may raise.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_logs import read_records, write_run
from rich.console import Console
from top_snapshots import T0, ranks, results

from fsdpmon.diagnose import glance, judge
from fsdpmon.errors import InputError
from fsdpmon.job.snapshot import GpuRow, History, JobSnapshot, NodeRow, ProcessRow, RankRow
from fsdpmon.report.loader import load_runs
from fsdpmon.report.stats import run_stats, with_scaling
from fsdpmon.report.table import markdown_report
from fsdpmon.scrape.aggregate import ScrapeResult, aggregate
from fsdpmon.scrape.expfmt import Sample
from fsdpmon.scrape.wanted import WANTED
from fsdpmon.top.cli import snapshot_json
from fsdpmon.top.ui_state import VIEWS, ViewState
from fsdpmon.top.views import frame, once_frame

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
# the values that broke readers, drawn often; any float otherwise
NASTY = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308, -1e308]),
                  ANY_FLOAT)
# Rendering costs ~0.1 s a frame on a loaded 2-core machine: each example renders one view,
# drawn, and the examples are few but each poisons many fields at once.
SETTINGS = settings(max_examples=15, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _render(renderable: Any) -> str:
    console = Console(width=120, height=40, file=io.StringIO(), color_system=None,
                      force_terminal=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def screens(snap: JobSnapshot) -> list[ViewState | None]:
    """Every screen of `top` for this snapshot (None: the --once frame)."""
    return [None, *(ViewState(view=v) for v in VIEWS),
            *(ViewState(view="rank", subject=str(r.rank)) for r in snap.ranks[:2]),
            *(ViewState(view="gpu", subject=f"{g.node}/{g.gpu}") for g in snap.gpus[:2])]


def read_everything(snap: JobSnapshot, screen: int | None = None) -> None:
    """What reads a snapshot: a screen of top (all when ``screen`` is None) with its verdict,
    JSON, diagnosis (the state was judged when the snapshot was built)."""
    states = screens(snap)
    verdict = judge([snap])
    for state in states if screen is None else [states[screen % len(states)]]:
        _render(once_frame(snap, verdict) if state is None
                else frame(snap, state, height=40, verdict=verdict))
    json.loads(snapshot_json(snap, verdict))  # strict JSON: non-finite figures become null
    judge([snap, dataclasses.replace(snap, time=snap.time + 30)])


# -- the aggregate: every value top reads, from a real (synthetic) job's expositions ---------

HEALTHY = results(ranks())
READ = [(i, j) for i, r in enumerate(HEALTHY) for j, s in enumerate(r.samples or ())
        if s.name in WANTED]


@st.composite
def poisoned(draw: st.DrawFn) -> list[ScrapeResult]:
    """The healthy job's scrape results with some of the values top reads replaced."""
    chosen = draw(st.lists(st.sampled_from(READ), min_size=1, max_size=40, unique=True))
    values = {key: draw(NASTY) for key in chosen}
    out = []
    for i, r in enumerate(HEALTHY):
        samples = [Sample(s.name, s.labels, values.get((i, j), s.value))
                   for j, s in enumerate(r.samples or ())]
        out.append(dataclasses.replace(r, samples=samples))
    return out


@SETTINGS
@given(poisoned(), poisoned(), st.integers(0, 100))
def test_any_value_in_any_series_top_reads_never_breaks_a_reader(first, second, screen) -> None:
    before = aggregate(first, now=T0, source="targets")
    after = aggregate(second, now=T0 + 2, source="targets", previous=before)
    read_everything(before, screen)
    read_everything(after, screen + 1)


def test_loss_of_plus_and_minus_infinity_is_shown_as_such() -> None:
    """The case that crashed `top --once` (statistics.fmean: -inf + inf in fsum)."""
    losses = {0: math.inf, 1: -math.inf}
    loss_name = "fsdpmon_train_loss"
    mixed = [dataclasses.replace(r, samples=[  # without rank 0's job figures: top averages
        Sample(s.name, s.labels, losses.get(int(s.labels.get("rank", -1)), s.value))
        if s.name == loss_name else s for s in r.samples or ()
        if s.name != "fsdpmon_job_loss_mean"]) for r in HEALTHY]
    snap = aggregate(mixed, now=T0, source="targets")
    assert [r.loss for r in snap.ranks[:2]] == [math.inf, -math.inf]
    assert snap.loss is not None and math.isnan(snap.loss), f"job loss {snap.loss}"
    assert "loss_nonfinite" in {f.cause for f in glance([snap])}
    text = _render(frame(snap, ViewState(view="ranks"), height=40, verdict=judge([snap])))
    assert "inf" in text.lower() and "-inf" in text.lower(), "the ranks view hides the infinities"
    read_everything(snap)


# -- the snapshot: every numeric field of every row, drawn directly --------------------------

def _field_strategy(f: dataclasses.Field) -> st.SearchStrategy | None:
    kind = str(f.type)
    if kind.startswith("tuple[tuple[str, float]"):  # (label value, figure): XID counts
        return st.lists(st.tuples(st.sampled_from(["79", "13", "48"]), NASTY), max_size=3).map(
            tuple)
    if kind.startswith("tuple[float"):
        return st.lists(NASTY, max_size=8).map(tuple)
    if "float" in kind:
        return st.one_of(st.none(), NASTY)
    if kind in ("int | None", "int"):
        ints = st.integers(min_value=-(2**63), max_value=2**63)
        return st.one_of(st.none(), ints) if "None" in kind else ints
    if kind == "bool":
        return st.booleans()
    return None  # strings, enums, nested rows: kept as the healthy snapshot has them


IDENTIFIERS = ("rank", "pid", "ranks")  # which rows these are, not figures


def _row(row: Any) -> st.SearchStrategy:
    drawn = {f.name: s for f in dataclasses.fields(row)
             if (s := _field_strategy(f)) is not None and f.name not in IDENTIFIERS}
    return st.fixed_dictionaries(drawn).map(lambda d: dataclasses.replace(row, **d))


BASE = aggregate(HEALTHY, now=T0, source="targets")


@st.composite
def wild_snapshot(draw: st.DrawFn) -> JobSnapshot:
    top = {f.name: s for f in dataclasses.fields(JobSnapshot)
           if (s := _field_strategy(f)) is not None and f.name != "time"}
    history = draw(st.fixed_dictionaries({f.name: st.lists(NASTY, max_size=8).map(tuple)
                                          for f in dataclasses.fields(History)}))
    return dataclasses.replace(
        BASE, **draw(st.fixed_dictionaries(top)), history=History(**history),
        ranks=tuple(draw(_row(r)) for r in BASE.ranks),
        gpus=tuple(draw(_row(g)) for g in BASE.gpus),
        nodes=tuple(draw(_row(n)) for n in BASE.nodes),
        processes=tuple(draw(_row(p)) for p in BASE.processes))


def test_the_drawn_snapshot_covers_every_numeric_field() -> None:
    for cls in (JobSnapshot, RankRow, GpuRow, NodeRow, ProcessRow, History):
        numeric = [f.name for f in dataclasses.fields(cls) if _field_strategy(f) is not None]
        untouched = [f.name for f in dataclasses.fields(cls)
                     if ("float" in str(f.type) or "int" in str(f.type))
                     and f.name not in numeric and f.name not in (*IDENTIFIERS, "time")]
        assert not untouched, f"{cls.__name__}: numeric fields not drawn: {untouched}"


@SETTINGS
@given(wild_snapshot(), st.integers(0, 100))
def test_any_number_in_any_snapshot_field_never_breaks_a_reader(snap, screen) -> None:
    read_everything(snap, screen)


# -- report: logs whose figures are not finite ----------------------------------------------

LOG_FIELDS = ("loss", "mfu", "peak_memory_bytes", "data_wait_ratio", "tokens_per_second",
              "step_time_s", "tokens_total", "time")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.tuples(st.integers(0, 1), st.integers(1, 6), st.sampled_from(LOG_FIELDS)),
                       NASTY, min_size=1, max_size=12))
def test_report_reads_logs_with_any_figure_or_names_the_bad_field(tmp_path_factory, poison):
    base = tmp_path_factory.mktemp("logs") / "run.jsonl"
    paths = write_run(base, 2, log_steps=6)
    for rank, path in enumerate(paths):
        records = read_records(path)
        for (r, line, field), value in poison.items():
            if r == rank:
                records[line][field] = value
        path.write_text("".join(json.dumps(rec) + "\n" for rec in records))  # NaN, Infinity
    try:
        runs = load_runs([str(base)])
    except InputError as err:  # a required figure that is not a number: one line naming it
        assert "must be a finite number" in str(err) and "\n" not in str(err)
        return
    try:
        stats = with_scaling([run_stats(runs[0])])
    except InputError as err:  # finite figures whose arithmetic overflows: one line naming it
        assert "out of any real range" in str(err) and "\n" not in str(err), str(err)
        return
    markdown_report(stats, warmup="default", chart_name=None)
    json.dumps([dataclasses.asdict(s) for s in stats], allow_nan=False)


def test_report_names_figures_whose_arithmetic_overflows(tmp_path):
    """1e308 is finite, so the loader takes it; the mean of two such throughputs overflowed
    fsum (OverflowError out of the report) before: now the mean is exact and the job's total,
    which no float holds, is named in one line."""
    base = tmp_path / "run.jsonl"
    for path in write_run(base, 2, log_steps=3):
        records = read_records(path)
        for i, rec in enumerate(records):  # tokens_total falling (a reset): the logged rate
            rec["tokens_per_second"], rec["tokens_total"] = 1e308, len(records) - i
        path.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    runs = load_runs([str(base)])
    try:
        run_stats(runs[0])
    except InputError as err:
        assert "tokens_per_second comes out as inf" in str(err), str(err)
    else:
        raise AssertionError("a job total past float's limit was reported")


def test_top_averages_finite_figures_near_floats_limit() -> None:
    """Every rank's loss at 1e308 (finite): fmean's exact sum overflowed (OverflowError out of
    the refresh) before; the job's mean is the value itself."""
    huge = [dataclasses.replace(r, samples=[  # no job-level mean: top averages the ranks
        Sample(s.name, s.labels, 1e308) if s.name == "fsdpmon_train_loss" else s
        for s in r.samples or () if s.name != "fsdpmon_job_loss_mean"]) for r in HEALTHY]
    snap = aggregate(huge, now=T0, source="targets")
    losses = [r.loss for r in snap.ranks]
    assert len(losses) > 1 and all(v == 1e308 for v in losses), losses
    assert snap.loss == 1e308, snap.loss


def test_a_pod_claiming_an_absurd_world_size_costs_nothing() -> None:
    """world_size is what a pod says: 1e18 ranks must not make top or diagnosis build
    range(world_size) (it hung the property test above before it was bounded)."""
    claims = [dataclasses.replace(r, samples=[
        Sample(s.name, s.labels, 1e18) if s.name == "fsdpmon_job_world_size" else s
        for s in r.samples or ()]) for r in HEALTHY]

    def timed(results: list[ScrapeResult]) -> tuple[JobSnapshot, float]:
        started = time.perf_counter()
        snap = aggregate(results, now=T0, source="targets")
        read_everything(snap, 0)
        return snap, time.perf_counter() - started

    _, healthy = timed(HEALTHY)
    snap, absurd = timed(claims)
    # the first ranks past the four that answer, as many as asked for, and no more
    assert [r.rank for r in snap.ranks] == [0, 1, 2, 3], snap.ranks
    assert snap.unseen_ranks(limit=10) == tuple(range(4, 14)), snap.unseen_ranks(limit=10)
    # side by side: the same work as a healthy job's (range(1e18) would never finish)
    assert absurd < 10 * healthy, f"{absurd:.2f}s vs {healthy:.2f}s for a healthy job"
