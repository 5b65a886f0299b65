"""Pure views: a JobSnapshot (and what the user chose to see) → rich renderables.

Nothing here does I/O or reads the clock; tests render these to a string console and compare
the text. Tables show as many rows as fit around the selection and say how many are off
screen, so a 2048-rank job reads like an 8-rank one. When a small job's ranks leave room, the
GPUs show under them (nvtop's split), so one screen holds the whole job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fsdpmon.diagnose import Verdict
from fsdpmon.job.snapshot import SPARK_WIDTH, JobSnapshot, JobState
from fsdpmon.top import details, fmt
from fsdpmon.top.columns import Row
from fsdpmon.top.diagnosis_view import DiagnosisPane, verdict_lines
from fsdpmon.top.fitted import FittedLine, Part, WordCutLine
from fsdpmon.top.tables import filter_rows, gpu_summary, row_key, select_rows, table_of
from fsdpmon.top.ui_state import VIEWS, Nav, ViewState

STATE_STYLE = {
    JobState.RUNNING: "bold green",
    JobState.DEGRADED: "bold yellow",
    JobState.STALLED: "bold white on red",
    JobState.DONE: "bold cyan",
    JobState.FAILED: "bold white on red",
    JobState.RESTARTING: "bold black on yellow",
    JobState.DOWN: "bold white on red",
}
TABLE_VIEWS = ("ranks", "gpus", "processes")
VIEW_TITLES = {"ranks": "Ranks", "gpus": "GPUs", "processes": "Processes", "logs": "Logs",
               "diagnosis": "Diagnosis", "help": "Help", "rank": "rank", "gpu": "GPU",
               "process": "process"}
HELP_KEYS = (
    ("1 2 3 4 5", "ranks, GPUs, processes, logs, diagnosis"),
    ("Tab", "next view"),
    ("↑ ↓  j k", "move the selection"),
    ("PgUp PgDn Home End", "a page up / down, the first / last row (also g G)"),
    ("Enter", "open the selected rank, GPU or process"),
    ("Esc  Backspace", "back to where you were; closes this help"),
    ("/", "filter this view as you type (Enter keeps it, Esc drops it)"),
    ("F", "follow the stalled rank, else the slowest (any move stops)"),
    ("< >  s", "sort by the previous / next column"),
    ("i", "invert the sort order"),
    ("[ ]", "previous / next log in the logs view"),
    ("?", "this help"),
    ("q  Ctrl-C", "quit"),
)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def _title(snap: JobSnapshot) -> FittedLine:
    return FittedLine(
        Part(Text("fsdpmon top  ", style="bold"), 30),
        Part(Text.assemble("job ", (snap.job_name or "?", "bold"), "  ")),
        Part(Text(f" {snap.state.value} ", style=STATE_STYLE[snap.state])),
        Part(Text(f" {snap.reason.split(':')[0]}", style="bold red") if snap.reason else "",
             75),
        Part(f"  {snap.model}" if snap.model else "", 20),
        Part(f"  world {snap.world_size or fmt.MISSING}", 45),
        Part(f"  targets {snap.targets_up}/{len(snap.targets)} up", 50),
        Part(f"  {_clock(snap.time)}", 60),
    )


def _progress(snap: JobSnapshot) -> FittedLine:
    parts = [Part(f"step {fmt.MISSING if snap.step is None else snap.step}")]
    if snap.total_steps:
        parts += [Part(f"/{snap.total_steps}"),
                  Part(Text(" ").append_text(fmt.bar(snap.progress, 20, "cyan")), 20),
                  Part(f" {fmt.pct(snap.progress, 1)}", 55)]
    parts += [Part(f"  ETA {fmt.duration(snap.eta_s)}", 60),
              Part(f"  restarts {snap.restarts or 0}", 70 if snap.restarts else 25)]
    return FittedLine(*parts)


def _speed(snap: JobSnapshot) -> FittedLine:
    hist = snap.history
    goodput = ([] if snap.goodput_ratio is None else
               [Part(f"  goodput {fmt.pct(snap.goodput_ratio, 1)}", 5)])
    return FittedLine(
        Part(f"tok/s {fmt.si(snap.tokens_per_second)}"),
        Part(Text(" " + fmt.sparkline(hist.tokens_per_second, SPARK_WIDTH), style="cyan"), 15),
        Part(f"  MFU {fmt.pct(snap.mfu_ratio, 1)}", 50),
        Part(f"  step {fmt.seconds(snap.step_time_median_s)} med", 70),
        Part(f" {fmt.seconds(snap.step_time_max_s)} max", 35),
        Part(f"  loss {fmt.fixed(snap.loss)}", 65),
        Part(Text(" " + fmt.sparkline(hist.loss, SPARK_WIDTH), style="magenta"), 14),
        *goodput,
    )


def header_lines(snap: JobSnapshot, verdict: Verdict | None = None) -> list[RenderableType]:
    """Job identity and state, progress, speed and loss, then the diagnosis: the top finding
    and what the latest refresh shows that no finding confirms yet."""
    lines: list[RenderableType] = [_title(snap), _progress(snap), _speed(snap)]
    if snap.reason:  # the job's own word on why (a failed condition's reason and message)
        lines.append(WordCutLine(f"! {snap.state.value}: {snap.reason}", "bold red"))
    return lines + verdict_lines(verdict)


def tab_bar(state: ViewState) -> FittedLine:
    parts = []
    top = state.back[0].view if state.back else state.view
    for i, view in enumerate(VIEWS[:-1], start=1):
        style = "bold reverse" if view == top else "dim"
        parts.append(Part(Text(f" {i} {VIEW_TITLES[view]} ", style=style)))
    for st in (*state.back[1:], state) if state.back else ():
        if st.view != top:
            label = f"{VIEW_TITLES[st.view]} {st.subject}".strip()
            parts.append(Part(Text(f" › {label} ", style="bold")))
    parts.append(Part(Text(" ? Help  Esc back  q Quit", style="dim"), 10))
    if state.follow:
        parts.append(Part(Text("  following", style="bold cyan")))
    if state.editing_filter:
        parts.append(Part(Text(f"  /{state.draft}_", style="bold")))
    elif state.filter:
        parts.append(Part(Text(f"  filter: {state.filter}", style="bold")))
    return FittedLine(*parts)


@dataclass(frozen=True)
class Layout:
    """How the body's lines are shared: the selectable table's page, and the GPU pane under
    the ranks (0 rows: no pane)."""

    rows: list[Row]
    page: int
    gpu_page: int = 0
    process_page: int = 0


def layout(snap: JobSnapshot, state: ViewState, avail: int) -> Layout:
    view = state.view
    if view in TABLE_VIEWS:
        rows = select_rows(getattr(snap, view), view, state)
        if view == "gpus":
            return Layout(rows, max(1, avail - 3))
        panes = _panes_under_ranks(snap, len(rows), avail) if view == "ranks" else None
        if panes is not None:
            return Layout(rows, max(1, len(rows)), *panes)
        return Layout(rows, max(1, avail - 2))
    if view in ("rank", "gpu"):
        rows = details.processes_for(snap, state)
        return Layout(rows, details.process_page(snap, state, avail))
    return Layout([], 1)


def _panes_under_ranks(snap: JobSnapshot, ranks: int, avail: int) -> tuple[int, int] | None:
    """(GPU pane rows, process pane rows) under a Ranks table of ``ranks`` rows, when the
    screen has room for them (a small job); None when it has not."""
    spare = avail - (ranks + 2) - 1  # blank line between the panes
    if not snap.gpus or spare < 4:  # summary, header, a row, footer
        return None
    gpu_page = min(len(snap.gpus), spare - 3)
    rest = spare - (gpu_page + 3) - 1
    return gpu_page, (rest - 2 if rest >= 3 and snap.processes else 0)


def shows_processes(snap: JobSnapshot, state: ViewState, height: int, notice: str = "",
                    verdict: Verdict | None = None) -> bool:
    """Whether this screen shows process figures: the Processes view, a rank's or a GPU's
    screen, or the Ranks view of a small job with room left for the processes table (which
    depends on how many ranks the filter leaves, not on their order: no sort)."""
    if state.view in ("processes", "rank", "gpu"):
        return True
    if state.view != "ranks" or not snap.processes:
        return False
    ranks = len(filter_rows(snap.ranks, "ranks", state))
    panes = _panes_under_ranks(snap, ranks, _avail(snap, height, notice, verdict))
    return panes is not None and panes[1] > 0


def _followed(snap: JobSnapshot, state: ViewState) -> str:
    if not (state.follow and state.view == "ranks"):
        return state.selected
    stalled = snap.stalled_ranks
    if stalled:
        return str(stalled[0])
    return "" if snap.slowest_rank is None else str(snap.slowest_rank)


def _avail(snap: JobSnapshot, height: int, notice: str, verdict: Verdict | None = None) -> int:
    return height - len(header_lines(snap, verdict)) - (1 if notice else 0) - 1


def nav(snap: JobSnapshot, state: ViewState, height: int, notice: str = "",
        verdict: Verdict | None = None) -> Nav:
    """What the movement keys move over on this screen."""
    plan = layout(snap, state, _avail(snap, height, notice, verdict))
    keys = tuple(row_key(r) for r in plan.rows)
    current = _followed(snap, state)
    if current not in keys:
        current = keys[min(state.cursor, len(keys) - 1)] if keys else ""
    return Nav(keys, plan.page, current)


def _ranks_view(snap: JobSnapshot, state: ViewState, plan: Layout,
                interactive: bool) -> RenderableType:
    if not snap.ranks:
        return Text("no ranks reported yet", style="dim")
    parts: list[RenderableType] = [table_of(plan.rows, "ranks", state, plan.page,
                                            interactive=interactive,
                                            current=_followed(snap, state))]
    if plan.gpu_page:
        parts += [Text(""), _gpus(snap, ViewState(view="gpus"), plan.gpu_page, False)]
    if plan.process_page:
        procs = ViewState(view="processes")
        parts += [Text(""), table_of(select_rows(snap.processes, "processes", procs),
                                     "processes", procs, plan.process_page, interactive=False)]
    return Group(*parts)


def _gpus(snap: JobSnapshot, state: ViewState, page: int, interactive: bool,
          rows: list[Row] | None = None) -> RenderableType:
    """The GPU summary and table; ``rows`` the GPUs filtered and sorted (layout's), else
    sorted here."""
    if not snap.gpus:
        return Text("no GPUs reported (is the exporter in --targets?)", style="dim")
    simulated = any(n.simulated for n in snap.nodes)
    if rows is None:
        rows = select_rows(snap.gpus, "gpus", state)
    return Group(gpu_summary(snap.gpus, simulated),
                 table_of(rows, "gpus", state, page, interactive=interactive,
                          current=state.selected))


def logs_view(snap: JobSnapshot, max_rows: int) -> RenderableType:
    if not snap.log_pod:
        return Text("Logs come from the Kubernetes API (run with --job or --selector) or, in "
                    "`fsdpmon demo`, from the demo's own log files.", style="dim")
    title = Text(f"logs of {snap.log_pod} (following)  [ ] other log", style="bold",
                 no_wrap=True, overflow="ellipsis")
    lines = [Text(line, no_wrap=True, overflow="ellipsis")
             for line in snap.logs[-max(1, max_rows - 1):]]
    # (Text, not str: log lines are untrusted and must not be parsed as markup)
    return Group(title, *(lines or [Text("(no log lines yet)", style="dim")]))


def help_view() -> RenderableType:
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for keys, what in HELP_KEYS:
        table.add_row(keys, what)
    notes = Text(
        "States: RUNNING, DEGRADED (a target down, straggler, memory pressure), STALLED (a rank "
        "made no step within its threshold), RESTARTING (ranks being restarted), DONE (every "
        "rank finished), FAILED (ranks gone before their last step), DOWN (nothing answers).",
        style="dim")
    return Group(table, Text(""), notes)


def body(snap: JobSnapshot, state: ViewState, avail: int,
         interactive: bool = True, verdict: Verdict | None = None) -> RenderableType:
    """The selected view in ``avail`` lines."""
    if state.view == "diagnosis":
        return DiagnosisPane(verdict, avail)
    plan = layout(snap, state, avail)
    if state.view == "ranks":
        return _ranks_view(snap, state, plan, interactive)
    if state.view == "gpus":  # sorted once, by layout (2048 GPUs on a large job)
        return _gpus(snap, state, plan.page, interactive, plan.rows)
    if state.view == "processes":
        if not snap.processes:
            return Text("no processes reported yet", style="dim")
        return table_of(plan.rows, "processes", state, plan.page, interactive=interactive,
                        current=state.selected)
    if state.view == "logs":
        return logs_view(snap, avail)
    if state.view in details.VIEWS:
        return details.detail_view(snap, state, avail, plan.rows, plan.page)
    return help_view()


def frame(snap: JobSnapshot, state: ViewState, height: int, notice: str = "",
          verdict: Verdict | None = None) -> RenderableType:
    """One full screen: header, tab bar, the selected view fitted to the terminal height.

    ``notice`` is a source problem (API error, retrying) shown under the header; ``verdict``
    the diagnosis of the recent history (the header's top finding, the Diagnosis view).
    """
    head = header_lines(snap, verdict)
    if notice:
        head.append(WordCutLine(f"! {notice}", "bold red"))
    avail = max(1, _avail(snap, height, notice, verdict))
    return Group(*head, tab_bar(state), body(snap, state, avail, verdict=verdict))


def waiting_frame(what: str, notice: str = "") -> RenderableType:
    """Before the first snapshot: what we are connecting to, and any error so far."""
    lines = [Text(f"fsdpmon top: reading {what} ...", style="bold")]
    if notice:
        lines.append(Text(f"! {notice}", style="bold red"))
    lines.append(Text("q quits", style="dim"))
    return Group(*lines)


def once_frame(snap: JobSnapshot, verdict: Verdict | None = None,
               max_rows: int = 16) -> RenderableType:
    """What `--once` prints: the header, then ranks, GPUs and processes (``max_rows`` each)."""
    parts: list[RenderableType] = [*header_lines(snap, verdict)]
    for view, noun in (("ranks", "ranks"), ("gpus", "GPUs"), ("processes", "processes")):
        parts += [Text(""), Text(VIEW_TITLES[view], style="bold underline")]
        rows: Sequence[Row] = getattr(snap, view)
        if not rows:
            parts.append(Text(f"no {noun} reported yet", style="dim"))
        elif view == "gpus":
            parts.append(_gpus(snap, ViewState(view=view), max_rows, False))
        else:
            parts.append(table_of(select_rows(rows, view, ViewState(view=view)), view,
                                  ViewState(view=view), max_rows, interactive=False))
    return Group(*parts)
