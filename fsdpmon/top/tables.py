"""The table machinery every view shares: filter and sort rows, cut the window that fits the
screen around the selection, mark the selected row, and say how many rows are off screen.

Rows are named by a key (a rank number, ``node/gpu``, ``node/pid``) so the selection follows
its row when a refresh reorders the table, as htop's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from rich.console import Group
from rich.text import Text

from fsdpmon.job.snapshot import SPARK_WIDTH, GpuRow, RankRow
from fsdpmon.top import fmt
from fsdpmon.top.celltable import CellColumn, CellTable
from fsdpmon.top.columns import COLUMNS, Column, Row, column
from fsdpmon.top.fitted import FittedLine, Part
from fsdpmon.top.ui_state import ViewState

MARK = "▸"
HEADER_STYLE = "bold reverse"
NOUNS = {"ranks": ("rank", "ranks"), "gpus": ("GPU", "GPUs"),
         "processes": ("process", "processes")}


def row_key(row: Row) -> str:
    if isinstance(row, RankRow):
        return str(row.rank)
    if isinstance(row, GpuRow):
        return f"{row.node}/{row.gpu}"
    return f"{row.node}/{row.pid}"


def _matches(row: Row, cols: Sequence[Column], needle: str) -> bool:
    return any(needle in str(c.value(row)).lower() for c in cols)


_VALUE = itemgetter(0)


def filter_rows(rows: Sequence[Row], view: str, state: ViewState,
                needle: str | None = None) -> Sequence[Row]:
    """The rows that match the view's filter (or ``needle``), in their order."""
    cols = COLUMNS[view]
    needle = (state.active_filter if needle is None else needle).lower()
    return [r for r in rows if _matches(r, cols, needle)] if needle else rows


def select_rows(rows: Sequence[Row], view: str, state: ViewState,
                needle: str | None = None) -> list[Row]:
    """Filtered (by the view's filter, or ``needle``), then sorted by the chosen column
    (unknown values last)."""
    rows = filter_rows(rows, view, state, needle)
    key, descending = state.sort_for(view)
    col = column(view, key)
    valued = list(zip(map(col.value, rows), rows, strict=True))  # each value taken once
    known = [pair for pair in valued if pair[0] not in (None, "")]
    known.sort(key=_VALUE, reverse=descending)  # by the value alone: stable, as rows were
    return [r for _, r in known] + [r for value, r in valued if value in (None, "")]


def window(n: int, position: int | None, state: ViewState, page: int) -> tuple[int, int]:
    """(first row on screen, selected index) of ``n`` rows, the current one at ``position``
    (None: not among them): the selection stays on screen, the window moves as little as it
    must (the state's ``top`` is where the keys left it)."""
    page = max(1, page)
    if n == 0:
        return 0, -1
    index = position if position is not None else min(state.cursor, n - 1)
    top = min(state.top, index, max(0, n - page))
    return max(top, index - page + 1, 0), index


def row_style(row: Row) -> str:
    if isinstance(row, RankRow):
        if row.down:
            return "dim"
        if row.stalled:
            return "bold red"
        return "yellow" if row.slowest else ""
    if isinstance(row, GpuRow) and not row.up:
        return "dim red"
    return ""


def new_table(cols: Sequence[Column], sort: tuple[str, bool], marker: bool) -> CellTable:
    """The marker of the selected row is the first cell's first character (a column of its
    own would cost two of the 80 columns)."""
    headers = []
    for i, c in enumerate(cols):
        arrow = (" ↓" if sort[1] else " ↑") if c.key == sort[0] else ""
        lead = " " if marker and i == 0 else ""
        headers.append(CellColumn(lead + c.title + arrow, justify=c.justify,
                                  min_width=c.min_width, max_width=c.max_width, ratio=c.ratio))
    return CellTable(headers, header_style=HEADER_STYLE)


def footer(start: int, shown: int, total: int, view: str, state: ViewState,
           sort_view: str = "") -> Text:
    """'4 ranks' or '21-40 of 512 ranks · 20 above · 472 below', the sort and the filter."""
    noun, nouns = NOUNS.get(sort_view or view, (view, view))
    if shown < total:
        text = f"{start + 1}-{start + shown} of {total} {nouns}"
        above, below = start, total - start - shown
        text += f" · {above} above" if above else ""
        text += f" · {below} below" if below else ""
    else:
        text = f"{total} {noun if total == 1 else nouns}"
    key, descending = state.sort_for(sort_view or view)
    if key:
        text += f" · sorted by {column(sort_view or view, key).title} {'↓' if descending else '↑'}"
    if state.active_filter:
        text += f" · filter {state.active_filter!r}"
    return Text(text, style="dim", no_wrap=True, overflow="ellipsis")


def cells(row: Row, cols: Sequence[Column]) -> list[Text]:
    if isinstance(row, GpuRow):
        return gpu_cells(row)
    # Text, never str: pod names and command lines are untrusted and must not be read as rich
    # markup ("[/x]" in a command line would raise).
    return [Text(c.text(row)) for c in cols]


def table_of(rows: Sequence[Row], view: str, state: ViewState, page: int, *,
             interactive: bool = True, current: str = "", sort_view: str = "") -> Group:
    """At most ``page`` rows around the selection, the selected one marked, and a footer."""
    cols = GPU_TABLE if view == "gpus" else COLUMNS[sort_view or view]
    # where the current row is: looked for only when there is one (the rows run to thousands)
    position = next((i for i, r in enumerate(rows) if row_key(r) == current), None) \
        if current else None
    start, index = window(len(rows), position, state, page) if interactive else (0, -1)
    sort = state.sort_for(sort_view or view)
    table = new_table(cols, sort, marker=interactive)
    shown = rows[start:start + max(1, page)]
    for i, row in enumerate(shown, start=start):
        style = row_style(row)
        line = cells(row, cols)
        if interactive:
            first = line[0]
            line[0] = Text(MARK if i == index else " ").append_text(first)
            style = f"{style} reverse".strip() if i == index else style
        table.add_row(*line, style=style)
    return Group(table, footer(start, len(shown), len(rows), view, state, sort_view))


# The GPU table shows bars and history, so its columns are its own; sorting uses COLUMNS.
GPU_TABLE: tuple[Column, ...] = (
    Column("node", "NODE", str, justify="left", max_width=16),
    Column("gpu", "GPU", str),
    Column("util", "UTIL", str, justify="left", min_width=15),
    Column("memory", "MEM", str, justify="left", min_width=17),
    Column("temp", "TEMP", str),
    Column("power", "POWER", str),
    Column("", "HISTORY", str, justify="left", min_width=SPARK_WIDTH),
    Column("pod", "POD", str, justify="left", max_width=24, ratio=1),
)


def gpu_cells(g: GpuRow) -> list[Text]:
    util_style = fmt.level_style(g.utilization_ratio, 0.6, 0.3, high_is_bad=False)
    mem_style = fmt.level_style(g.memory_ratio, 0.85, 0.95, high_is_bad=True)
    temp = g.temperature_celsius
    temp_style = "dim" if temp is None else "red" if temp >= 85 else "yellow" if temp >= 75 else ""
    util = fmt.bar(g.utilization_ratio, 10, util_style).append(f"{fmt.pct(g.utilization_ratio):>5}")
    mem = fmt.bar(g.memory_ratio, 10, mem_style).append(f" {fmt.size(g.memory_used_bytes):>6}")
    return [
        Text(g.node), Text(g.gpu if g.up else f"{g.gpu}!"), util, mem,
        Text(column("gpus", "temp").show(temp), style=temp_style),
        Text(column("gpus", "power").show(g.power_watts)),
        Text(fmt.sparkline(g.utilization_history, SPARK_WIDTH), style="cyan"), Text(g.pod),
    ]


def gpu_summary(gpus: Sequence[GpuRow], simulated: bool = False) -> FittedLine:
    """One line over all GPUs; parts that do not fit are left out whole."""
    utils = [g.utilization_ratio for g in gpus if g.utilization_ratio is not None]
    mems = [ratio for g in gpus if (ratio := g.memory_ratio) is not None]
    temps = [g.temperature_celsius for g in gpus if g.temperature_celsius is not None]
    power = sum(g.power_watts for g in gpus if g.power_watts is not None)
    nodes = len({g.node for g in gpus})
    models = sorted({g.model for g in gpus if g.model})
    parts = [Part(fmt.plural(len(gpus), "GPU"))]
    if models:
        parts.append(Part(f" ({', '.join(models)})", 90 if simulated else 30))
    parts.append(Part(f" on {fmt.plural(nodes, 'node')}", 55))
    if utils:
        parts.append(Part(f" · util avg {fmt.pct(sum(utils) / len(utils))} "
                          f"min {fmt.pct(min(utils))}", 60))
    if mems:
        parts.append(Part(f" · mem avg {fmt.pct(sum(mems) / len(mems))} "
                          f"max {fmt.pct(max(mems))}", 50))
    if temps:
        parts.append(Part(f" · temp max {max(temps):.0f}C", 40))
    parts.append(Part(f" · {power / 1000:.1f}kW", 10))
    return FittedLine(*parts)
