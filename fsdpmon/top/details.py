"""Drill-down screens, opened with Enter on a row: a rank (its figures, its GPU, its pod's
processes and its log), a GPU (its figures, the rank it serves, its processes), a process (all
that is known of it). Pure functions of the snapshot, like the other views.

How rows are tied together: a rank's pod (Kubernetes) or its node (plain targets) owns its
processes; a rank uses the GPU whose index is its local rank on its node (one GPU per rank, as
torchrun sets it up); a process holds memory on the GPUs its per-GPU series name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from fsdpmon.job.snapshot import GpuRow, JobSnapshot, ProcessRow, RankRow
from fsdpmon.top import fmt
from fsdpmon.top.columns import Row
from fsdpmon.top.tables import select_rows, table_of
from fsdpmon.top.ui_state import ViewState

VIEWS = ("rank", "gpu", "process")
LOG_LINES = 6  # a rank's screen shows this many of its latest log lines
_RANK_TAG = re.compile(r"\[rank(\d+)\]")  # the trainer's log format: "... [rank3] INFO ..."


def _line(text: str, style: str = "") -> Text:
    # Text, never markup: pod names, commands and log lines are untrusted
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


def find_rank(snap: JobSnapshot, key: str) -> RankRow | None:
    return next((r for r in snap.ranks if str(r.rank) == key), None)


def find_gpu(snap: JobSnapshot, key: str) -> GpuRow | None:
    return next((g for g in snap.gpus if f"{g.node}/{g.gpu}" == key), None)


def find_process(snap: JobSnapshot, key: str) -> ProcessRow | None:
    return next((p for p in snap.processes if f"{p.node}/{p.pid}" == key), None)


def gpus_of_rank(snap: JobSnapshot, rank: RankRow) -> list[GpuRow]:
    held = [g for g in snap.gpus if f"{g.node}/{g.gpu}" in rank.gpus]
    if held:  # the exporter saw this rank's process on them (NVML's compute processes)
        return held
    mine = [g for g in snap.gpus if (rank.pod and g.pod == rank.pod) or g.node == rank.node]
    own = [g for g in mine if rank.local_rank is not None and g.gpu == str(rank.local_rank)]
    return own or [g for g in mine if rank.pod and g.pod == rank.pod]


def ranks_of_gpu(snap: JobSnapshot, gpu: GpuRow) -> list[RankRow]:
    held = [r for r in snap.ranks if r.rank in gpu.ranks]
    if held:  # processes of these ranks hold the GPU (NVML's compute processes)
        return held
    near = [r for r in snap.ranks if (gpu.pod and r.pod == gpu.pod) or r.node == gpu.node]
    own = [r for r in near if r.local_rank is not None and str(r.local_rank) == gpu.gpu]
    return own or [r for r in near if gpu.pod and r.pod == gpu.pod]


def processes_for(snap: JobSnapshot, state: ViewState) -> list[Row]:
    """The processes a rank's or a GPU's screen lists (filtered and sorted as the user chose)."""
    procs: Sequence[ProcessRow] = ()
    if state.view == "rank" and (rank := find_rank(snap, state.subject)):
        procs = [p for p in snap.processes
                 if (p.pod == rank.pod if rank.pod else p.node == rank.node)]
    elif state.view == "gpu" and (gpu := find_gpu(snap, state.subject)):
        procs = [p for p in snap.processes if p.node == gpu.node and gpu.gpu in p.gpus]
    return select_rows(procs, "processes", state)


def rank_log(snap: JobSnapshot, rank: RankRow) -> list[str]:
    """The rank's lines of the log being followed: its pod's log, or (one log for all ranks,
    as the demo's) the lines tagged with its rank or with no rank."""
    if not snap.logs or (rank.pod and snap.log_pod and snap.log_pod != rank.pod):
        return []
    out = []
    for line in snap.logs:
        tag = _RANK_TAG.search(line)
        if tag is None or int(tag.group(1)) == rank.rank or rank.pod:
            out.append(line)
    return out


def _rank_lines(snap: JobSnapshot, r: RankRow) -> list[Text]:
    where = [f"rank {r.rank}", f"pod {r.pod}" if r.pod else "", f"node {r.node}" if r.node else "",
             "" if r.local_rank is None else f"local rank {r.local_rank}",
             f"target {r.target}" if r.target else "", r.flags]
    total = f"/{snap.total_steps}" if snap.total_steps else ""
    memory = fmt.size(r.peak_memory_bytes)
    if r.memory_capacity_bytes:
        memory += f" of {fmt.size(r.memory_capacity_bytes)}"
    return [
        _line("  ".join(w for w in where if w), "bold"),
        _line(f"step {fmt.MISSING if r.step is None else r.step}{total}  "
              f"step time {fmt.seconds(r.step_time_s)}  data wait {fmt.pct(r.data_wait_ratio)}  "
              f"tok/s {fmt.si(r.tokens_per_second)}  MFU {fmt.pct(r.mfu_ratio, 1)}  "
              f"loss {fmt.fixed(r.loss)}"),
        _line(f"memory peak {memory}  last step {fmt.age(r.heartbeat_age_s)} ago  "
              f"stall after {fmt.age(r.stall_threshold_s)}"),
    ]


def _gpu_lines(snap: JobSnapshot, g: GpuRow) -> list[Text]:
    served = ranks_of_gpu(snap, g)
    serves = ("serves " + ", ".join(f"rank {r.rank}" + (f" (pod {r.pod})" if r.pod else "")
                                    for r in served)) if served else "serves no rank seen"
    memory = fmt.size(g.memory_used_bytes)
    if g.memory_total_bytes:
        memory += f" of {fmt.size(g.memory_total_bytes)} ({fmt.pct(g.memory_ratio)})"
    power = fmt.unit(g.power_watts, "W")
    if g.power_limit_watts:
        power += f" of {fmt.unit(g.power_limit_watts, 'W')}"
    return [
        _line(f"GPU {g.gpu} on {g.node}  {g.model}  {g.uuid}" + ("" if g.up else "  LOST"),
              "bold"),
        _line(f"util {fmt.pct(g.utilization_ratio)}  memory {memory}  "
              f"temp {fmt.unit(g.temperature_celsius, 'C')}  power {power}"),
        _line(serves),
    ]


def process_page(snap: JobSnapshot, state: ViewState, avail: int) -> int:
    """Rows left for the process table on a rank's or a GPU's screen."""
    fixed = 3 + 1 + 2  # the figures, a blank line, the table's header and footer
    if state.view == "rank" and (rank := find_rank(snap, state.subject)):
        gpus = gpus_of_rank(snap, rank)
        fixed += 2 + len(gpus) if gpus else 0  # blank + GPU header + its rows
        if rank_log(snap, rank):
            fixed += 2 + LOG_LINES
    return max(1, avail - fixed)


def detail_view(snap: JobSnapshot, state: ViewState, avail: int, rows: list[Row],
                page: int) -> RenderableType:
    if state.view == "rank" and (rank := find_rank(snap, state.subject)):
        return _rank_view(snap, state, rank, rows, page)
    if state.view == "gpu" and (gpu := find_gpu(snap, state.subject)):
        return Group(*_gpu_lines(snap, gpu), Text(""), _procs(rows, state, page, "GPU"))
    if state.view == "process" and (proc := find_process(snap, state.subject)):
        return _process_view(snap, proc)
    return _line(f"{state.view} {state.subject} is no longer reported (Esc goes back)", "dim")


def _procs(rows: list[Row], state: ViewState, page: int, owner: str) -> RenderableType:
    if not rows:
        return _line(f"no processes of this {owner} reported (needs the exporter on its node)",
                     "dim")
    return table_of(rows, "processes", state, page, current=state.selected,
                    sort_view="processes")


def _rank_view(snap: JobSnapshot, state: ViewState, rank: RankRow, rows: list[Row],
               page: int) -> RenderableType:
    parts: list[RenderableType] = [*_rank_lines(snap, rank)]
    gpus = gpus_of_rank(snap, rank)
    if gpus:
        parts += [Text(""), table_of(gpus, "gpus", ViewState(view="gpus"), len(gpus),
                                     interactive=False)]
    parts += [Text(""), _procs(rows, state, page, "rank")]
    log = rank_log(snap, rank)
    if log:
        parts += [Text(""), _line(f"log ({snap.log_pod}, latest lines)", "bold")]
        parts += [_line(line) for line in log[-LOG_LINES:]]
    return Group(*parts)


def _process_view(snap: JobSnapshot, p: ProcessRow) -> RenderableType:
    owner = [r.rank for r in snap.ranks if p.pod and r.pod == p.pod]
    fields = (
        ("PID", str(p.pid)), ("node", p.node), ("pod", "/".join(x for x in (p.namespace, p.pod)
                                                              if x) or fmt.MISSING),
        ("container", p.container or fmt.MISSING), ("user", p.user or fmt.MISSING),
        ("state", p.state or fmt.MISSING), ("CPU", f"{fmt.pct(p.cpu_ratio)} of one core"),
        ("RSS", fmt.size(p.rss_bytes)),
        ("GPU memory", fmt.size(p.gpu_memory_bytes)
         + (f" on GPU {', '.join(p.gpus)}" if p.gpus else "")),
        ("ranks of its pod", ", ".join(map(str, owner)) or fmt.MISSING),
    )
    lines: list[RenderableType] = [_line(f"{k:>16}  {v}") for k, v in fields]
    lines.append(Text(f"{'command':>16}  {p.command}", overflow="fold"))  # whole, wrapped
    return Group(*lines)
