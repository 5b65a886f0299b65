"""Pure views: a JobSnapshot (and what the user chose to see) → rich renderables.

Nothing here does I/O or reads the clock; tests render these to a string console and compare
the text. Tables show as many rows as fit and say how many they left out, so a 2048-rank job
reads like an 8-rank one: summaries on top, the rows that matter (by the chosen sort) below.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fsdpmon.top import fmt
from fsdpmon.top.columns import COLUMNS, Column, Row, column
from fsdpmon.top.snapshot import GpuRow, JobSnapshot, JobState, RankRow, Severity
from fsdpmon.top.ui_state import VIEWS, ViewState

STATE_STYLE = {
    JobState.RUNNING: "bold green",
    JobState.DEGRADED: "bold yellow",
    JobState.STALLED: "bold white on red",
    JobState.DONE: "bold cyan",
    JobState.DOWN: "bold white on red",
}
MAX_ALERT_LINES = 3
SPARK_WIDTH = 10
VIEW_TITLES = {"ranks": "Ranks", "gpus": "GPUs", "processes": "Processes", "logs": "Logs",
               "help": "Help"}
HELP_KEYS = (
    ("1 2 3 4", "ranks, GPUs, processes, logs"),
    ("Tab", "next view"),
    ("< > / s", "sort by the previous / next column"),
    ("i", "invert the sort order"),
    ("/", "filter rows (Enter applies, Esc clears)"),
    ("[ ]", "previous / next pod in the logs view"),
    ("?", "this help"),
    ("q / Ctrl-C", "quit"),
)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def header_lines(snap: JobSnapshot) -> list[Text]:
    """Job identity and state, progress, speed and loss, then the active alerts."""
    title = Text.assemble(
        ("fsdpmon top", "bold"), "  job ", (snap.job_name or "?", "bold"), "  ",
        (f" {snap.state.value} ", STATE_STYLE[snap.state]),
        f"  {snap.model}" if snap.model else "",
        f"  world {snap.world_size or fmt.MISSING}",
        f"  targets {snap.targets_up}/{len(snap.targets)} up",
        f"  {_clock(snap.time)}",
    )
    progress = Text(f"step {fmt.MISSING if snap.step is None else snap.step}")
    if snap.total_steps:
        progress.append(f"/{snap.total_steps} ")
        progress.append_text(fmt.bar(snap.progress, 20, "cyan"))
        progress.append(f" {fmt.pct(snap.progress, 1)}")
    progress.append(f"  ETA {fmt.duration(snap.eta_s)}  restarts {snap.restarts or 0}")
    hist = snap.history
    speed = Text.assemble(
        f"tok/s {fmt.si(snap.tokens_per_second)} ",
        (fmt.sparkline(hist.tokens_per_second, SPARK_WIDTH), "cyan"),
        f"  MFU {fmt.pct(snap.mfu_ratio, 1)}",
        f"  step {fmt.seconds(snap.step_time_median_s)} med",
        f" {fmt.seconds(snap.step_time_max_s)} max",
        f"  loss {fmt.fixed(snap.loss)} ", (fmt.sparkline(hist.loss, SPARK_WIDTH), "magenta"),
    )
    lines = [title, progress, speed]
    for alert in snap.alerts[:MAX_ALERT_LINES]:
        style = "bold red" if alert.severity is Severity.CRITICAL else "yellow"
        lines.append(Text(f"! {alert.message}", style=style))
    if len(snap.alerts) > MAX_ALERT_LINES:
        lines.append(Text(f"! +{len(snap.alerts) - MAX_ALERT_LINES} more alerts", style="red"))
    for line in lines:
        line.no_wrap, line.overflow = True, "ellipsis"
    return lines


def tab_bar(state: ViewState) -> Text:
    bar = Text(no_wrap=True, overflow="ellipsis")
    for i, view in enumerate(VIEWS[:4], start=1):
        style = "bold reverse" if view == state.view else "dim"
        bar.append(f" {i} {VIEW_TITLES[view]} ", style=style)
    bar.append(" ? Help  q Quit", style="dim")
    if state.editing_filter:
        bar.append(f"  /{state.draft}_", style="bold")
    elif state.filter:
        bar.append(f"  filter: {state.filter}", style="bold")
    return bar


def _matches(row: Row, cols: Sequence[Column], needle: str) -> bool:
    return any(needle in str(c.value(row)).lower() for c in cols)


def select_rows(rows: Sequence[Row], view: str, state: ViewState) -> list[Row]:
    """Filtered, then sorted by the chosen column (unknown values last)."""
    cols = COLUMNS[view]
    if state.filter:
        needle = state.filter.lower()
        rows = [r for r in rows if _matches(r, cols, needle)]
    key, descending = state.sort_for(view)
    col = column(view, key)
    known = [r for r in rows if col.value(r) not in (None, "")]
    unknown = [r for r in rows if col.value(r) in (None, "")]
    known.sort(key=col.value, reverse=descending)
    return known + unknown


def _row_style(row: Row) -> str:
    if isinstance(row, RankRow):
        if row.down:
            return "dim"
        if row.stalled:
            return "bold red"
        return "yellow" if row.slowest else ""
    if isinstance(row, GpuRow) and not row.up:
        return "dim red"
    return ""


def _table(cols: Sequence[Column], sort: tuple[str, bool]) -> Table:
    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True, show_edge=False,
                  header_style="bold reverse")
    for c in cols:
        arrow = (" ↓" if sort[1] else " ↑") if c.key == sort[0] else ""
        table.add_column(c.title + arrow, justify=c.justify, no_wrap=True,  # type: ignore[arg-type]
                         overflow="ellipsis", min_width=c.min_width, max_width=c.max_width,
                         ratio=c.ratio)
    return table


def _footer(shown: int, total: int, what: str, state: ViewState, view: str) -> Text:
    key, descending = state.sort_for(view)
    text = f"{shown} of {total} {what}" if shown < total else f"{total} {what}"
    text += f" · sorted by {column(view, key).title} {'↓' if descending else '↑'}"
    if state.filter:
        text += f" · filter {state.filter!r}"
    return Text(text, style="dim", no_wrap=True, overflow="ellipsis")


def rows_table(snap: JobSnapshot, view: str, state: ViewState, max_rows: int) -> RenderableType:
    """Ranks or processes as a table of at most ``max_rows`` rows plus a footer line."""
    rows: Sequence[Row] = snap.ranks if view == "ranks" else snap.processes
    what = "ranks" if view == "ranks" else "processes"
    if not rows:
        return Text(f"no {what} reported yet", style="dim")
    chosen = select_rows(rows, view, state)
    cols = COLUMNS[view]
    table = _table(cols, state.sort_for(view))
    for row in chosen[:max(1, max_rows)]:
        # Text, never str: pod names and command lines are untrusted and must not be read as
        # rich markup ("[/x]" in a command line would raise).
        table.add_row(*(Text(c.show(c.value(row))) for c in cols), style=_row_style(row))
    return Group(table, _footer(min(len(chosen), max(1, max_rows)), len(chosen), what, state,
                                view))


def _gpu_cells(g: GpuRow) -> list[RenderableType]:
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


def _gpu_summary(gpus: Sequence[GpuRow]) -> Text:
    utils = [g.utilization_ratio for g in gpus if g.utilization_ratio is not None]
    mems = [g.memory_ratio for g in gpus if g.memory_ratio is not None]
    temps = [g.temperature_celsius for g in gpus if g.temperature_celsius is not None]
    power = sum(g.power_watts for g in gpus if g.power_watts is not None)
    nodes = len({g.node for g in gpus})
    models = sorted({g.model for g in gpus if g.model})
    text = f"{len(gpus)} GPUs"
    if models:
        text += f" ({', '.join(models)})"
    text += f" on {nodes} node{'s' if nodes != 1 else ''}"
    if utils:
        text += f" · util avg {fmt.pct(sum(utils) / len(utils))} min {fmt.pct(min(utils))}"
    if mems:
        text += f" · mem avg {fmt.pct(sum(mems) / len(mems))} max {fmt.pct(max(mems))}"
    if temps:
        text += f" · temp max {max(temps):.0f}C"
    text += f" · {power / 1000:.1f}kW"
    return Text(text, no_wrap=True, overflow="ellipsis")


def gpu_view(snap: JobSnapshot, state: ViewState, max_rows: int) -> RenderableType:
    """nvtop-like: per GPU utilisation and memory bars, temperature, power, utilisation history."""
    if not snap.gpus:
        return Text("no GPUs reported (is the exporter in --targets?)", style="dim")
    chosen = select_rows(snap.gpus, "gpus", state)
    sort = state.sort_for("gpus")
    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True,
                  header_style="bold reverse")
    for key, title, just, width in (
        ("node", "NODE", "left", None), ("gpu", "GPU", "right", None),
        ("util", "UTIL", "left", 15), ("memory", "MEM", "left", 17),
        ("temp", "TEMP", "right", None),
        ("power", "POWER", "right", None), ("", "HISTORY", "left", SPARK_WIDTH),
        ("pod", "POD", "left", None),
    ):
        arrow = (" ↓" if sort[1] else " ↑") if key == sort[0] else ""
        table.add_column(title + arrow, justify=just, no_wrap=True, overflow="ellipsis",  # type: ignore[arg-type]
                         min_width=width, max_width=16 if key in ("node", "pod") else None,
                         ratio=1 if key == "pod" else None)
    rows = max(1, max_rows - 1)
    for g in chosen[:rows]:
        table.add_row(*_gpu_cells(g), style=_row_style(g))  # type: ignore[arg-type]
    return Group(_gpu_summary(snap.gpus), table,
                 _footer(min(len(chosen), rows), len(chosen), "GPUs", state, "gpus"))


def logs_view(snap: JobSnapshot, max_rows: int) -> RenderableType:
    if not snap.log_pod:
        return Text("Logs come from the Kubernetes API: run with --job or --selector "
                    "(not available with --targets or --prometheus).", style="dim")
    title = Text(f"logs of {snap.log_pod} (training container, following)  [ ] other pod",
                 style="bold", no_wrap=True, overflow="ellipsis")
    lines = [Text(line, no_wrap=True, overflow="ellipsis") for line in snap.logs[-max_rows:]]
    # (Text, not str: log lines are untrusted and must not be parsed as markup)
    return Group(title, *(lines or [Text("(no log lines yet)", style="dim")]))


def help_view() -> RenderableType:
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for keys, what in HELP_KEYS:
        table.add_row(keys, what)
    notes = Text(
        "States: RUNNING, DEGRADED (a target down, straggler, memory pressure), STALLED (a rank "
        "made no step within its threshold), DONE, DOWN (nothing answers).", style="dim")
    return Group(table, Text(""), notes)


def body(snap: JobSnapshot, state: ViewState, max_rows: int) -> RenderableType:
    """The selected view, sized to ``max_rows`` table rows."""
    if state.view == "gpus":
        return gpu_view(snap, state, max_rows)
    if state.view in ("ranks", "processes"):
        return rows_table(snap, state.view, state, max_rows)
    if state.view == "logs":
        return logs_view(snap, max_rows)
    return help_view()


def frame(snap: JobSnapshot, state: ViewState, height: int, notice: str = "") -> RenderableType:
    """One full screen: header, tab bar, the selected view fitted to the terminal height.

    ``notice`` is a source problem (API error, retrying) shown under the header.
    """
    head = header_lines(snap)
    if notice:
        head.append(Text(f"! {notice}", style="bold red", no_wrap=True, overflow="ellipsis"))
    # header + tab bar + table header + footer (+ summary line in the GPU view)
    spare = height - len(head) - 1 - 2 - (1 if state.view == "gpus" else 0)
    return Group(*head, tab_bar(state), body(snap, state, max(1, spare)))


def waiting_frame(what: str, notice: str = "") -> RenderableType:
    """Before the first snapshot: what we are connecting to, and any error so far."""
    lines = [Text(f"fsdpmon top: reading {what} ...", style="bold")]
    if notice:
        lines.append(Text(f"! {notice}", style="bold red"))
    lines.append(Text("q quits", style="dim"))
    return Group(*lines)


def once_frame(snap: JobSnapshot, max_rows: int = 16) -> RenderableType:
    """What `--once` prints: the header, then ranks, GPUs and processes (``max_rows`` each)."""
    parts: list[RenderableType] = [*header_lines(snap)]
    for view in ("ranks", "gpus", "processes"):
        parts += [Text(""), Text(VIEW_TITLES[view], style="bold underline"),
                  body(snap, ViewState(view=view), max_rows)]
    return Group(*parts)
