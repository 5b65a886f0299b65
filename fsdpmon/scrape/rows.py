"""The snapshot's rows from one refresh's accumulators: ranks, GPUs, nodes, processes.

Rows carry history from the previous snapshot (sparklines) and keep ranks and GPUs whose target
went quiet, marked down. Each rank names the GPUs its worker holds and each GPU its ranks, from
the exporter's process table, as the rows are built.
"""

from __future__ import annotations

import functools
import math
import operator
import statistics
from collections.abc import Sequence
from dataclasses import replace

from fsdpmon.conventions import below_straggler_line
from fsdpmon.job.snapshot import (
    SPARK_WIDTH,
    GpuRow,
    JobSnapshot,
    NodeRow,
    ProcessRow,
    RankRow,
    TargetStatus,
)
from fsdpmon.scrape.filing import Acc, as_int
from fsdpmon.scrape.frozen import maker

HISTORY_LEN = 60
Ties = tuple[dict[int, tuple[str, ...]], dict[tuple[str, str], tuple[int, ...]]]


new_rank_row, new_gpu_row = maker(RankRow), maker(GpuRow)
new_node_row, new_process_row = maker(NodeRow), maker(ProcessRow)


def opt(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def opt_int(value: object) -> int | None:
    """An integer figure, or None when absent or not finite (pods can serve NaN and Inf)."""
    if value is None or not math.isfinite(value):  # type: ignore[arg-type]
        return None
    return int(value)  # type: ignore[call-overload]


def rank_row(rank: int, d: dict[str, object], now: float, gpus: tuple[str, ...] = ()) -> RankRow:
    """A rank's row from its accumulator (filing.Acc.ranks): the figures filed under a field's
    name (floats, as parsed; pod, node, target, local_rank) are taken as they are, the rest
    converted here."""
    get = d.get
    age, threshold = get("heartbeat_age_s"), get("stall_threshold_s")
    stalled = get("stalled") == 1.0 or (
        age is not None and threshold is not None and threshold > 0 and age > threshold  # type: ignore[operator]
    )
    straggling, inside = get("straggling"), get("in_collective")
    return new_rank_row(
        d, rank=rank, step=opt_int(get("step")), stalled=stalled,
        peak_memory_bytes=get("peak_memory_bytes", get("rss_bytes")),
        straggling=None if straggling is None else straggling == 1.0,
        unresponsive=get("unresponsive") == 1.0, loss_nonfinite=get("loss_nonfinite") == 1.0,
        restarts=opt_int(get("restarts")), seen_at=now, gpus=gpus,
        collective_entered=opt_int(get("collective_entered")),
        in_collective=None if inside is None else inside == 1.0,
        step_collectives=opt_int(get("step_collectives")),
        step_fingerprint=opt_int(get("step_fingerprint")),
        step_end_seq=opt_int(get("step_end_seq")), entered_op=opt_int(get("entered_op")),
        entered_elements=opt_int(get("entered_elements")),
        entered_dtype=opt_int(get("entered_dtype")),
        entered_off_pattern=None if get("entered_off_pattern") is None
        else get("entered_off_pattern") == 1.0,
        break_step=opt_int(get("break_step")), break_index=opt_int(get("break_index")),
        break_op=opt_int(get("break_op")), break_elements=opt_int(get("break_elements")),
        break_dtype=opt_int(get("break_dtype")),
        break_expected_op=opt_int(get("break_expected_op")),
        break_expected_elements=opt_int(get("break_expected_elements")),
        break_expected_dtype=opt_int(get("break_expected_dtype")),
        previous_exit_step=opt_int(get("previous_exit_step")),
        loss_first_nonfinite_step=opt_int(get("loss_first_nonfinite_step")),
        grad_norm_first_nonfinite_step=opt_int(get("grad_norm_first_nonfinite_step")),
    )


def push(history: tuple[float, ...], value: float | None,
         keep: int = HISTORY_LEN) -> tuple[float, ...]:
    """``history`` and ``value``: its last ``keep`` values (as it is when there is no value)."""
    if value is None:
        return history
    return (*history[-(keep - 1):], value)


def gpu_rows(acc: Acc, previous: JobSnapshot | None, down_nodes: set[str],
             ranks_on: dict[tuple[str, str], tuple[int, ...]]) -> list[GpuRow]:
    before = {(g.node, g.gpu): g for g in previous.gpus} if previous else {}
    rows = []
    for (node, gpu), d in acc.gpus.items():
        # filed under the fields' names: the figures (floats) and the labels (model, uuid, pod...)
        get = d.get
        old = before.get((node, gpu))
        events, xids = get("clock_events"), get("xid_counts")
        rows.append(new_gpu_row(
            d, node=node, gpu=gpu, up=get("up", 1.0) == 1.0,
            clock_events=tuple(sorted(events)) if events else (),  # type: ignore[call-overload]
            xid_counts=tuple(sorted(xids)) if xids else (),  # type: ignore[call-overload]
            utilization_history=push(old.utilization_history if old else (),
                                     get("utilization_ratio"), SPARK_WIDTH),  # type: ignore[arg-type]
            ranks=ranks_on.get((node, gpu), ()),
        ))
    # GPUs of an exporter that stopped answering stay visible, marked down.
    rows += [replace(g, up=False, ranks=ranks_on.get((g.node, g.gpu), g.ranks))
             for g in before.values() if g.node in down_nodes and (g.node, g.gpu) not in acc.gpus]
    return sorted(rows, key=lambda g: (g.node, _gpu_order(g.gpu)))


def node_rows(acc: Acc, gpus: Sequence[GpuRow]) -> list[NodeRow]:
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.node] = counts.get(g.node, 0) + 1
    names = sorted(set(acc.nodes) | set(counts))
    return [new_node_row(
        node=n, gpus=counts.get(n, 0),
        cpu_utilization_ratio=opt(acc.nodes.get(n, {}).get("cpu_utilization_ratio")),
        memory_used_bytes=opt(acc.nodes.get(n, {}).get("memory_used_bytes")),
        memory_total_bytes=opt(acc.nodes.get(n, {}).get("memory_total_bytes")),
        load1=opt(acc.nodes.get(n, {}).get("load1")),
        simulated=bool(acc.nodes.get(n, {}).get("simulated", False)),
    ) for n in names]


def process_rows(acc: Acc) -> list[ProcessRow]:
    """Rows from the processes' accumulators, whose entries are filed under the fields' names
    (labels as str, figures as float, ``rank`` as int) but for ``gpus`` (a set)."""
    simulated = {node for node, host in acc.nodes.items() if host.get("simulated")}
    # in (node, pid) order: the keys are unique, so the sort never compares the entries
    return [new_process_row(
        d, node=node, pid=pid, gpus=_held(held) if (held := d.get("gpus")) else (),
        gpu_simulated=bool(held) and node in simulated,
    ) for (node, pid), d in sorted(acc.procs.items())]


def carry_processes(fresh: tuple[ProcessRow, ...], previous: JobSnapshot,
                    targets: Sequence[TargetStatus]) -> tuple[ProcessRow, ...]:
    """The process rows of a refresh that did not ask for the process families: ``fresh``
    (from targets that ignore ``name[]``), and ``previous``'s rows of each node whose exporter
    answered without any. When that is all of ``previous``'s, its own tuple (which ties then
    knows)."""
    answered = {t.node for t in targets if t.up and t.kind == "exporter"}
    answered.difference_update(p.node for p in fresh)
    kept = [p for p in previous.processes if p.node in answered]
    if not fresh and len(kept) == len(previous.processes):
        return previous.processes
    return tuple(sorted([*fresh, *kept], key=_NODE_PID))


_NODE_PID = operator.attrgetter("node", "pid")


def _held(gpus: set[str]) -> tuple[str, ...]:
    return tuple(gpus) if len(gpus) == 1 else tuple(sorted(gpus, key=_gpu_order))


@functools.lru_cache(maxsize=1024)  # a node's few GPU ids, the same on every node
def _gpu_order(gpu: str) -> tuple[int, str]:
    return (as_int(gpu) or 0, gpu)


def _node_gpu_order(key: tuple[str, str]) -> tuple[str, tuple[int, str]]:
    return key[0], _gpu_order(key[1])


def ties(processes: Sequence[ProcessRow]) -> Ties:
    """(rank -> "node/gpu" of each GPU its worker holds, (node, gpu) -> the ranks on it): NVML
    lists the process on the GPU, the exporter reads the worker's RANK from its environment.

    Most ranks have one worker on one GPU, taken as it is; only a rank seen in several
    processes or GPUs needs its set sorted. The last answer is kept for the same tuple of rows
    (a refresh that carries every process row passes the last snapshot's)."""
    last = _LAST_TIES[0]
    if last is not None and last[0] is processes:
        return last[1]
    found = _ties(processes)
    if isinstance(processes, tuple):
        _LAST_TIES[0] = (processes, found)  # one entry, replaced at once
    return found


_LAST_TIES: list[tuple[tuple[ProcessRow, ...], Ties] | None] = [None]


def _ties(processes: Sequence[ProcessRow]) -> Ties:
    held: dict[int, list[tuple[str, str]]] = {}
    for p in processes:
        if p.rank is not None and p.gpus:
            gpus = p.gpus  # most often one: no comprehension for it
            keys = [(p.node, gpus[0])] if len(gpus) == 1 else [(p.node, g) for g in gpus]
            mine = held.setdefault(p.rank, keys)
            if mine is not keys:
                mine += keys
    gpus_of: dict[int, tuple[str, ...]] = {}
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, keys in held.items():
        if len(keys) > 1:
            keys = sorted(set(keys), key=_node_gpu_order)
        gpus_of[rank] = tuple([f"{n}/{g}" for n, g in keys])
        for key in keys:
            on = by_gpu.get(key)
            if on is None:
                by_gpu[key] = [rank]
            else:
                on.append(rank)
    return gpus_of, {key: tuple(sorted(ranks)) if len(ranks) > 1 else (ranks[0],)
                     for key, ranks in by_gpu.items()}


def mark_slowest(ranks: list[RankRow], job: dict[str, float]) -> int | None:
    """The job's slowest rank: its own verdict (the lowest straggler score), else the lowest
    published score, else the longest step. Its row is flagged SLOWEST only when it is a
    straggler: by the monitor's own persistent verdict (fsdpmon_train_straggling: the score
    below STRAGGLER_SCORE_THRESHOLD in two disjoint busy-time medians) where it publishes one,
    else by the score against the judge's line (conventions.below_straggler_line); so ranks
    equal to the millisecond, or one noisy window, are never flagged and the flag does not hop
    between ranks from one refresh to the next. Step time alone cannot name a compute straggler
    (every rank's step lasts as long as the slowest one's), so it only stands in where no
    score is published."""
    live = [r for r in ranks if not r.down and r.step_time_s is not None]
    if len(live) < 2:
        return None
    scored = [r for r in live if r.straggler_score is not None]
    slowest = opt_int(job.get("slowest_rank"))
    if slowest is None or all(r.rank != slowest for r in live):
        slowest = (min(scored, key=lambda r: (r.straggler_score, r.rank)).rank if scored
                   else max(live, key=lambda r: r.step_time_s or 0.0).rank)
    i = next(i for i, r in enumerate(ranks) if r.rank == slowest)  # a live rank's row
    r = ranks[i]
    straggles = r.straggling
    if straggles is None:
        score = r.straggler_score
        if score is None and r.step_time_s:  # no published score: median step time ÷ own
            score = statistics.median(r.step_time_s or 0.0 for r in live) / r.step_time_s
        straggles = below_straggler_line(score)  # the judge's line, not one of our own
    if straggles:
        ranks[i] = replace(r, slowest=True)
    return slowest


def carry_down_ranks(ranks: dict[int, RankRow], previous: JobSnapshot | None,
                     now: float, gpus_of: dict[int, tuple[str, ...]]) -> None:
    """Ranks seen before whose series are gone now stay listed, marked down (since when)."""
    for old in previous.ranks if previous else ():
        if old.rank not in ranks:
            ranks[old.rank] = replace(old, down=True, stalled=False, slowest=False,
                                      gone_at=old.gone_at if old.down else now,
                                      gpus=gpus_of.get(old.rank, old.gpus))

