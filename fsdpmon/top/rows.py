"""The snapshot's rows from one refresh's accumulators: ranks, GPUs, nodes, processes.

Rows carry history from the previous snapshot (sparklines) and keep ranks and GPUs whose target
went quiet, marked down. Each rank names the GPUs its worker holds and each GPU its ranks, from
the exporter's process table, as the rows are built.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.top.filing import Acc, as_int
from fsdpmon.top.snapshot import GpuRow, JobSnapshot, NodeRow, ProcessRow, RankRow

HISTORY_LEN = 60
Ties = tuple[dict[int, tuple[str, ...]], dict[tuple[str, str], tuple[int, ...]]]
R = TypeVar("R")


def maker(cls: type[R]) -> Callable[..., R]:
    """``cls(**values)`` for a frozen row dataclass, built without its generated __init__: that
    sets each field through ``object.__setattr__`` (the frozen guard), most of the time spent
    building a 2048-rank job's rows; this fills the new instance's ``__dict__`` at once, in field
    order. The same object (==, hash, repr, asdict) as ``cls(**values)`` for the same fields,
    which callers must all name when they have no default (test_snapshot checks each class)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(f.default_factory is not dataclasses.MISSING or not f.init for f in fields) or \
            hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain fields with plain defaults")
    defaults = {f.name: None if f.default is dataclasses.MISSING else f.default for f in fields}
    new = object.__new__

    def make(**values: object) -> R:
        row = new(cls)
        slots = row.__dict__
        slots.update(defaults)
        slots.update(values)
        return row

    return make


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
    age, threshold = opt(d.get("heartbeat_age_s")), opt(d.get("stall_threshold_s"))
    stalled = d.get("stalled") == 1.0 or (
        age is not None and threshold is not None and threshold > 0 and age > threshold
    )
    peak = d.get("peak_memory_bytes", d.get("rss_bytes"))
    return new_rank_row(
        rank=rank, local_rank=opt_int(d.get("local_rank")), pod=str(d.get("pod", "")),
        node=str(d.get("node", "")), target=str(d.get("target", "")),
        step=opt_int(d.get("step")), step_time_s=opt(d.get("step_time_s")),
        data_wait_ratio=opt(d.get("data_wait_ratio")),
        tokens_per_second=opt(d.get("tokens_per_second")), mfu_ratio=opt(d.get("mfu_ratio")),
        loss=opt(d.get("loss")), peak_memory_bytes=opt(peak),
        memory_capacity_bytes=opt(d.get("memory_capacity_bytes")), heartbeat_age_s=age,
        stall_threshold_s=threshold, stalled=stalled, busy_s=opt(d.get("busy_s")),
        collective_wait_ratio=opt(d.get("collective_wait_ratio")),
        straggler_score=opt(d.get("straggler_score")),
        straggling=None if opt(d.get("straggling")) is None else d["straggling"] == 1.0,
        unresponsive=d.get("unresponsive") == 1.0,
        loss_nonfinite=d.get("loss_nonfinite") == 1.0, checkpoint_s=opt(d.get("checkpoint_s")),
        checkpoint_seconds=opt(d.get("checkpoint_seconds")),
        checkpoint_own_seconds=opt(d.get("checkpoint_own_seconds")),
        checkpoint_time_ratio=opt(d.get("checkpoint_time_ratio")),
        restarts=opt_int(d.get("restarts")), seen_at=now, gpus=gpus,
        previous_exit=str(d.get("previous_exit", "")),
        previous_exit_step=opt_int(d.get("previous_exit_step")),
        previous_exit_unix=opt(d.get("previous_exit_unix")),
    )


def push(history: tuple[float, ...], value: float | None) -> tuple[float, ...]:
    if value is None:
        return history
    return (*history[-(HISTORY_LEN - 1):], value)


def gpu_rows(acc: Acc, previous: JobSnapshot | None, down_nodes: set[str],
             ranks_on: dict[tuple[str, str], tuple[int, ...]]) -> list[GpuRow]:
    before = {(g.node, g.gpu): g for g in previous.gpus} if previous else {}
    rows = []
    for (node, gpu), d in acc.gpus.items():
        old = before.get((node, gpu))
        util, mem_used = opt(d.get("utilization_ratio")), opt(d.get("memory_used_bytes"))
        mem_total = opt(d.get("memory_total_bytes"))
        mem_ratio = mem_used / mem_total if mem_used is not None and mem_total else None
        rows.append(new_gpu_row(
            node=node, gpu=gpu, model=str(d.get("model", "")), uuid=str(d.get("uuid", "")),
            up=d.get("up", 1.0) == 1.0, utilization_ratio=util, memory_used_bytes=mem_used,
            memory_total_bytes=mem_total, temperature_celsius=opt(d.get("temperature_celsius")),
            power_watts=opt(d.get("power_watts")),
            power_limit_watts=opt(d.get("power_limit_watts")),
            namespace=str(d.get("namespace", "")), pod=str(d.get("pod", "")),
            container=str(d.get("container", "")),
            clock_events=tuple(sorted(d.get("clock_events", ()))),  # type: ignore[call-overload]
            xid_counts=tuple(sorted(d.get("xid_counts", ()))),  # type: ignore[call-overload]
            ecc_uncorrected=opt(d.get("ecc_uncorrected")),
            utilization_history=push(old.utilization_history if old else (), util),
            memory_history=push(old.memory_history if old else (), mem_ratio),
            ranks=ranks_on.get((node, gpu), ()),
        ))
    # GPUs of an exporter that stopped answering stay visible, marked down.
    rows += [replace(g, up=False, ranks=ranks_on.get((g.node, g.gpu), g.ranks))
             for g in before.values() if g.node in down_nodes and (g.node, g.gpu) not in acc.gpus]
    return sorted(rows, key=lambda g: (g.node, as_int(g.gpu) or 0, g.gpu))


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
    rows = [new_process_row(
        node=node, pid=pid, namespace=str(d.get("namespace", "")), pod=str(d.get("pod", "")),
        container=str(d.get("container", "")), command=str(d.get("command", "")),
        user=str(d.get("user", "")), state=str(d.get("state", "")),
        cpu_ratio=opt(d.get("cpu_ratio")), rss_bytes=opt(d.get("rss_bytes")),
        gpu_memory_bytes=opt(d.get("gpu_memory_bytes")),
        rank=d.get("rank"),  # type: ignore[arg-type]
        gpus=tuple(sorted(d.get("gpus", ()), key=_gpu_order)),  # type: ignore[call-overload]
        gpu_simulated=bool(d.get("gpus")) and bool(acc.nodes.get(node, {}).get("simulated")),
    ) for (node, pid), d in acc.procs.items()]
    return sorted(rows, key=lambda p: (p.node, p.pid))


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (as_int(gpu) or 0, gpu)


def _rank_gpus(processes: Sequence[ProcessRow]) -> dict[int, tuple[tuple[str, str], ...]]:
    """Rank -> the (node, gpu) its worker process holds: NVML lists the process on the GPU,
    the exporter reads the worker's RANK from its environment."""
    out: dict[int, set[tuple[str, str]]] = {}
    for p in processes:
        if p.rank is not None:
            out.setdefault(p.rank, set()).update((p.node, g) for g in p.gpus)
    return {r: tuple(sorted(held, key=lambda k: (k[0], _gpu_order(k[1]))))
            for r, held in out.items() if held}


def ties(processes: Sequence[ProcessRow]) -> Ties:
    """(rank -> "node/gpu" of each GPU its worker holds, (node, gpu) -> the ranks on it)."""
    held = _rank_gpus(processes)
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, keys in held.items():
        for key in keys:
            by_gpu.setdefault(key, []).append(rank)
    return ({rank: tuple(f"{n}/{g}" for n, g in keys) for rank, keys in held.items()},
            {key: tuple(sorted(ranks)) for key, ranks in by_gpu.items()})


def mark_slowest(ranks: list[RankRow], job: dict[str, float]) -> int | None:
    """The job's slowest rank: its own verdict (the lowest straggler score), else the lowest
    published score, else the longest step. Its row is flagged SLOWEST only when it is a
    straggler: by the monitor's own persistent verdict (fsdpmon_train_straggling: the score
    below STRAGGLER_SCORE_THRESHOLD in two disjoint busy-time medians) where it publishes one,
    else by the score against the same line; so ranks equal to the millisecond, or one noisy
    window, are never flagged and the flag does not hop between ranks from one refresh to the
    next. Step time alone cannot name a compute straggler (every rank's step lasts as long
    as the slowest one's), so it only stands in where no score is published."""
    live = [r for r in ranks if not r.down and r.step_time_s is not None]
    if len(live) < 2:
        return None
    scored = [r for r in live if r.straggler_score is not None]
    slowest = opt_int(job.get("slowest_rank"))
    if slowest is None or all(r.rank != slowest for r in live):
        slowest = (min(scored, key=lambda r: (r.straggler_score, r.rank)).rank if scored
                   else max(live, key=lambda r: r.step_time_s or 0.0).rank)
    median = statistics.median(r.step_time_s or 0.0 for r in live)
    for i, r in enumerate(ranks):
        # without a published score: the same shape from step times, median ÷ own
        score = r.straggler_score if r.straggler_score is not None else (
            median / r.step_time_s if r.step_time_s else None)
        straggles = r.straggling if r.straggling is not None else (
            score is not None and score < STRAGGLER_SCORE_THRESHOLD)
        if r.rank == slowest and straggles:
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

