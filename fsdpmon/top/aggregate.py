"""Pure aggregation: parsed samples from many targets → one JobSnapshot.

Every metric name comes from the catalog (looked up at import, so a rename fails loudly here).
The previous snapshot is passed in to carry history (sparklines) and to remember ranks and GPUs
whose target went quiet, so a pod that stops answering is shown as down instead of vanishing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from fsdpmon import catalog
from fsdpmon.conventions import (
    JOB_LABEL,
    LOCAL_RANK_LABEL,
    RANK_LABEL,
    STRAGGLER_SCORE_THRESHOLD,
)
from fsdpmon.top.expfmt import Parser, Sample
from fsdpmon.top.health import alerts, settle
from fsdpmon.top.snapshot import (
    GpuRow,
    History,
    JobSnapshot,
    NodeRow,
    ProcessRow,
    RankRow,
    TargetStatus,
)

HISTORY_LEN = 60


# Per-rank figures: catalog name → accumulator key.
RANK_METRICS = {
    catalog.TRAIN_STEP.name: "step",
    catalog.TRAIN_TOTAL_STEPS.name: "total_steps",
    catalog.TRAIN_STEP_TIME_SECONDS.name: "step_time_s",
    catalog.TRAIN_DATA_WAIT_RATIO.name: "data_wait_ratio",
    catalog.TRAIN_TOKENS_PER_SECOND.name: "tokens_per_second",
    catalog.TRAIN_MFU_RATIO.name: "mfu_ratio",
    catalog.TRAIN_LOSS.name: "loss",
    catalog.TRAIN_LOSS_NONFINITE.name: "loss_nonfinite",
    catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name: "peak_memory_bytes",
    catalog.TRAIN_PROCESS_RSS_BYTES.name: "rss_bytes",
    catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name: "memory_capacity_bytes",
    catalog.TRAIN_HEARTBEAT_AGE_SECONDS.name: "heartbeat_age_s",
    catalog.TRAIN_STALL_THRESHOLD_SECONDS.name: "stall_threshold_s",
    catalog.TRAIN_STALLED.name: "stalled",
    catalog.TRAIN_RESTARTS.name: "restarts",
    catalog.TRAIN_BUSY_SECONDS.name: "busy_s",
    catalog.TRAIN_COLLECTIVE_WAIT_RATIO.name: "collective_wait_ratio",
    catalog.TRAIN_STRAGGLER_SCORE.name: "straggler_score",
    catalog.TRAIN_UNRESPONSIVE.name: "unresponsive",
    catalog.TRAIN_CHECKPOINT_SECONDS.name: "checkpoint_seconds",
    catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name: "checkpoint_own_seconds",
    catalog.TRAIN_CHECKPOINT_TIME_RATIO.name: "checkpoint_time_ratio",
    # served per phase; REQUIRE keeps only the checkpoint phase's series
    catalog.TRAIN_PHASE_DURATION_SECONDS.name: "checkpoint_s",
}
TRAIN_INFO = catalog.TRAIN_INFO.name
JOB_METRICS = {
    catalog.JOB_STEP_TIME_MEDIAN_SECONDS.name: "step_time_median_s",
    catalog.JOB_STEP_TIME_MAX_SECONDS.name: "step_time_max_s",
    catalog.JOB_SLOWEST_RANK.name: "slowest_rank",
    catalog.JOB_LOSS_MEAN.name: "loss",
    catalog.JOB_WORLD_SIZE.name: "world_size",
}
GPU_METRICS = {
    catalog.GPU_UP.name: "up",
    catalog.GPU_UTILIZATION_RATIO.name: "utilization_ratio",
    catalog.GPU_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.GPU_MEMORY_TOTAL_BYTES.name: "memory_total_bytes",
    catalog.GPU_TEMPERATURE_CELSIUS.name: "temperature_celsius",
    catalog.GPU_POWER_WATTS.name: "power_watts",
    catalog.GPU_POWER_LIMIT_WATTS.name: "power_limit_watts",
}
GPU_PROCESS_MEMORY = catalog.GPU_PROCESS_MEMORY_USED_BYTES.name
# GPU fault evidence, one series per reason / XID code / ECC type.
GPU_CLOCK_EVENT = catalog.GPU_CLOCK_EVENT_ACTIVE.name
GPU_XID = catalog.GPU_XID_ERRORS_TOTAL.name
GPU_ECC = catalog.GPU_ECC_ERRORS_TOTAL.name
GPU_EVENTS = frozenset([GPU_CLOCK_EVENT, GPU_XID, GPU_ECC])
EXPORTER_INFO = catalog.EXPORTER_INFO.name
HOST_METRICS = {
    catalog.HOST_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.HOST_MEMORY_TOTAL_BYTES.name: "memory_total_bytes",
    catalog.HOST_LOAD1.name: "load1",
}
HOST_CPU = catalog.HOST_CPU_UTILIZATION_RATIO.name
PROCESS_INFO = catalog.PROCESS_INFO.name
PROCESS_STATE = catalog.PROCESS_STATE.name
PROCESS_METRICS = {
    catalog.PROCESS_CPU_UTILIZATION_RATIO.name: "cpu_ratio",
    catalog.PROCESS_RESIDENT_MEMORY_BYTES.name: "rss_bytes",
}

# Everything top reads; sources pass it to the parser so that other series are never built.
WANTED: frozenset[str] = frozenset(
    [*RANK_METRICS, TRAIN_INFO, *JOB_METRICS, *GPU_METRICS, GPU_PROCESS_MEMORY, EXPORTER_INFO,
     *GPU_EVENTS,
     *HOST_METRICS, HOST_CPU, PROCESS_INFO, PROCESS_STATE, *PROCESS_METRICS]
)


# Of the per-core host CPU series, top shows only the node total.
REQUIRE = {HOST_CPU: 'cpu="all"', catalog.TRAIN_PHASE_DURATION_SECONDS.name: 'phase="checkpoint"',
           GPU_ECC: 'type="uncorrected"'}


def new_parser() -> Parser:
    """The parser every source uses: only what top reads (its label cache lives with it)."""
    return Parser(WANTED, REQUIRE)


@dataclass(frozen=True)
class Target:
    """Where one scrape came from; pod/node/namespace are known for Kubernetes targets."""

    url: str
    pod: str = ""
    node: str = ""
    namespace: str = ""


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    samples: Sequence[Sample] | None  # None when the target did not answer
    error: str = ""
    duration_s: float = 0.0


@dataclass
class _Acc:
    """Mutable accumulators for one refresh."""

    ranks: dict[int, dict[str, object]] = field(default_factory=dict)
    job: dict[str, float] = field(default_factory=dict)
    gpus: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    nodes: dict[str, dict[str, object]] = field(default_factory=dict)
    procs: dict[tuple[str, int], dict[str, object]] = field(default_factory=dict)
    job_name: str = ""
    model: str = ""
    # id(labels) -> row, one memo per kind: the same dict may label a rank and a GPU series
    rank_memo: dict[int, dict[str, object]] = field(default_factory=dict)
    gpu_memo: dict[int, dict[str, object]] = field(default_factory=dict)


def _as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _rank_entry(acc: _Acc, labels: dict[str, str], target: Target) -> dict[str, object] | None:
    rank = _as_int(labels.get(RANK_LABEL, ""))
    if rank is None:
        return None
    row = acc.ranks.get(rank)
    if row is None:
        row = acc.ranks[rank] = {"pod": target.pod, "node": target.node, "target": target.url,
                                 "local_rank": _as_int(labels.get(LOCAL_RANK_LABEL, ""))}
        acc.job_name = acc.job_name or labels.get(JOB_LABEL, "")
    acc.rank_memo[id(labels)] = row
    return row


def _add_info(acc: _Acc, row: dict[str, object], labels: dict[str, str]) -> None:
    row["node"] = labels.get("node") or row["node"]
    row["world_size"] = _as_int(labels.get("world_size", ""))
    acc.model = acc.model or labels.get("model", "")


def _gpu_entry(acc: _Acc, labels: dict[str, str]) -> dict[str, object]:
    key = labels.get("node", ""), labels.get("gpu", "")
    gpu = acc.gpus.get(key)
    if gpu is None:
        gpu = acc.gpus[key] = {}
    for name in ("model", "uuid", "namespace", "pod", "container"):
        if labels.get(name):
            gpu[name] = labels[name]
    acc.gpu_memo[id(labels)] = gpu
    return gpu


def _add_gpu_event(gpu: dict[str, object], s: Sample) -> None:
    """Throttle reasons active now, XID counts by code, uncorrected ECC count."""
    if s.name == GPU_CLOCK_EVENT:
        if s.value == 1.0:
            gpu.setdefault("clock_events", []).append(s.labels.get("reason", ""))  # type: ignore[union-attr]
    elif s.name == GPU_XID:
        gpu.setdefault("xid_counts", []).append((s.labels.get("xid", ""), s.value))  # type: ignore[union-attr]
    elif s.labels.get("type") == "uncorrected":
        gpu["ecc_uncorrected"] = s.value


def _add_host(acc: _Acc, s: Sample, node: str) -> None:
    host = acc.nodes.setdefault(node, {})
    if s.name == EXPORTER_INFO:
        host["simulated"] = s.labels.get("simulated", "").lower() in ("true", "1", "yes")
    elif s.name == HOST_CPU:
        if s.labels.get("cpu") == "all":
            host["cpu_utilization_ratio"] = s.value
    else:
        host[HOST_METRICS[s.name]] = s.value


_PROCESS_OWNER = ("namespace", "pod", "container")


def _add_process(acc: _Acc, s: Sample, node: str) -> None:
    labels = s.labels
    pid = _as_int(labels.get("pid", ""))
    if pid is None:
        return
    proc = acc.procs.get((node, pid))
    if proc is None:  # a process's series all carry its pod: read it from the first one
        proc = acc.procs[node, pid] = {key: labels[key] for key in _PROCESS_OWNER
                                       if labels.get(key)}
    if s.name == PROCESS_INFO:
        proc["command"] = labels.get("command", "")
        proc["user"] = labels.get("user", "")
        proc["rank"] = _as_int(labels.get("rank", ""))
    elif s.name == PROCESS_STATE:
        if s.value == 1:
            proc["state"] = labels.get("state", "")
    elif s.name == GPU_PROCESS_MEMORY:
        proc["gpu_memory_bytes"] = float(proc.get("gpu_memory_bytes", 0.0)) + s.value
        proc.setdefault("gpus", set()).add(labels.get("gpu", ""))  # type: ignore[union-attr]
    else:
        proc[PROCESS_METRICS[s.name]] = s.value


_PROCESS_NAMES = frozenset([*PROCESS_METRICS, PROCESS_INFO, PROCESS_STATE, GPU_PROCESS_MEMORY])


def _read(acc: _Acc, result: ScrapeResult) -> TargetStatus:
    """Files one target's samples into the accumulators.

    The hot path: a 256-node job has ~50k samples per refresh. The parser shares one label
    dict between the series of a rank (or a GPU), so rows are memoised by that dict's identity
    and most samples cost two dict lookups.
    """
    target, rank_memo, gpu_memo = result.target, acc.rank_memo, acc.gpu_memo
    train = exporter = False
    node = target.node
    for s in result.samples or ():
        name, labels = s.name, s.labels
        field_name = RANK_METRICS.get(name)
        if field_name is not None:
            train = True
            if field_name == "checkpoint_s" and labels.get("phase") != "checkpoint":
                continue  # (a parser without REQUIRE passes every phase)
            row = rank_memo.get(id(labels)) or _rank_entry(acc, labels, target)
            if row is not None:
                row[field_name] = s.value
            continue
        field_name = GPU_METRICS.get(name)
        if field_name is not None:
            gpu = gpu_memo.get(id(labels)) or _gpu_entry(acc, labels)
            gpu[field_name] = s.value
            node, exporter = labels.get("node") or node, True
        elif name in GPU_EVENTS:
            _add_gpu_event(gpu_memo.get(id(labels)) or _gpu_entry(acc, labels), s)
            exporter = True
        elif name == TRAIN_INFO:
            row = rank_memo.get(id(labels)) or _rank_entry(acc, labels, target)
            if row is not None:
                _add_info(acc, row, labels)
            train = True
        elif name in JOB_METRICS:
            acc.job[JOB_METRICS[name]] = s.value
            train = True
        elif name in _PROCESS_NAMES:
            _add_process(acc, s, labels.get("node") or node)
            exporter = True
        elif name in WANTED:
            node = labels.get("node") or node
            _add_host(acc, s, node)
            exporter = True
    kind = "train" if train else "exporter" if exporter else "unknown"
    return TargetStatus(url=result.target.url, kind=kind, up=True, duration_s=result.duration_s,
                        samples=len(result.samples or ()), pod=result.target.pod, node=node)


def _opt(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _opt_int(value: object) -> int | None:
    """An integer figure, or None when absent or not finite (pods can serve NaN and Inf)."""
    if value is None or not math.isfinite(value):  # type: ignore[arg-type]
        return None
    return int(value)  # type: ignore[call-overload]


def _rank_row(rank: int, d: dict[str, object], now: float) -> RankRow:
    age, threshold = _opt(d.get("heartbeat_age_s")), _opt(d.get("stall_threshold_s"))
    stalled = d.get("stalled") == 1.0 or (
        age is not None and threshold is not None and threshold > 0 and age > threshold
    )
    peak = d.get("peak_memory_bytes", d.get("rss_bytes"))
    return RankRow(
        rank=rank, local_rank=_opt_int(d.get("local_rank")), pod=str(d.get("pod", "")),
        node=str(d.get("node", "")), target=str(d.get("target", "")),
        step=_opt_int(d.get("step")), step_time_s=_opt(d.get("step_time_s")),
        data_wait_ratio=_opt(d.get("data_wait_ratio")),
        tokens_per_second=_opt(d.get("tokens_per_second")), mfu_ratio=_opt(d.get("mfu_ratio")),
        loss=_opt(d.get("loss")), peak_memory_bytes=_opt(peak),
        memory_capacity_bytes=_opt(d.get("memory_capacity_bytes")), heartbeat_age_s=age,
        stall_threshold_s=threshold, stalled=stalled, busy_s=_opt(d.get("busy_s")),
        collective_wait_ratio=_opt(d.get("collective_wait_ratio")),
        straggler_score=_opt(d.get("straggler_score")), unresponsive=d.get("unresponsive") == 1.0,
        loss_nonfinite=d.get("loss_nonfinite") == 1.0, checkpoint_s=_opt(d.get("checkpoint_s")),
        checkpoint_seconds=_opt(d.get("checkpoint_seconds")),
        checkpoint_own_seconds=_opt(d.get("checkpoint_own_seconds")),
        checkpoint_time_ratio=_opt(d.get("checkpoint_time_ratio")),
        restarts=_opt_int(d.get("restarts")), seen_at=now,
    )


def _push(history: tuple[float, ...], value: float | None) -> tuple[float, ...]:
    if value is None:
        return history
    return (*history[-(HISTORY_LEN - 1):], value)


def _gpu_rows(acc: _Acc, previous: JobSnapshot | None, down_nodes: set[str]) -> list[GpuRow]:
    before = {(g.node, g.gpu): g for g in previous.gpus} if previous else {}
    rows = []
    for (node, gpu), d in acc.gpus.items():
        old = before.get((node, gpu))
        util, mem_used = _opt(d.get("utilization_ratio")), _opt(d.get("memory_used_bytes"))
        mem_total = _opt(d.get("memory_total_bytes"))
        mem_ratio = mem_used / mem_total if mem_used is not None and mem_total else None
        rows.append(GpuRow(
            node=node, gpu=gpu, model=str(d.get("model", "")), uuid=str(d.get("uuid", "")),
            up=d.get("up", 1.0) == 1.0, utilization_ratio=util, memory_used_bytes=mem_used,
            memory_total_bytes=mem_total, temperature_celsius=_opt(d.get("temperature_celsius")),
            power_watts=_opt(d.get("power_watts")),
            power_limit_watts=_opt(d.get("power_limit_watts")),
            namespace=str(d.get("namespace", "")), pod=str(d.get("pod", "")),
            container=str(d.get("container", "")),
            clock_events=tuple(sorted(d.get("clock_events", ()))),  # type: ignore[call-overload]
            xid_counts=tuple(sorted(d.get("xid_counts", ()))),  # type: ignore[call-overload]
            ecc_uncorrected=_opt(d.get("ecc_uncorrected")),
            utilization_history=_push(old.utilization_history if old else (), util),
            memory_history=_push(old.memory_history if old else (), mem_ratio),
        ))
    # GPUs of an exporter that stopped answering stay visible, marked down.
    rows += [replace(g, up=False) for g in before.values()
             if g.node in down_nodes and (g.node, g.gpu) not in acc.gpus]
    return sorted(rows, key=lambda g: (g.node, _as_int(g.gpu) or 0, g.gpu))


def _node_rows(acc: _Acc, gpus: Sequence[GpuRow]) -> list[NodeRow]:
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.node] = counts.get(g.node, 0) + 1
    names = sorted(set(acc.nodes) | set(counts))
    return [NodeRow(
        node=n, gpus=counts.get(n, 0),
        cpu_utilization_ratio=_opt(acc.nodes.get(n, {}).get("cpu_utilization_ratio")),
        memory_used_bytes=_opt(acc.nodes.get(n, {}).get("memory_used_bytes")),
        memory_total_bytes=_opt(acc.nodes.get(n, {}).get("memory_total_bytes")),
        load1=_opt(acc.nodes.get(n, {}).get("load1")),
        simulated=bool(acc.nodes.get(n, {}).get("simulated", False)),
    ) for n in names]


def _process_rows(acc: _Acc) -> list[ProcessRow]:
    rows = [ProcessRow(
        node=node, pid=pid, namespace=str(d.get("namespace", "")), pod=str(d.get("pod", "")),
        container=str(d.get("container", "")), command=str(d.get("command", "")),
        user=str(d.get("user", "")), state=str(d.get("state", "")),
        cpu_ratio=_opt(d.get("cpu_ratio")), rss_bytes=_opt(d.get("rss_bytes")),
        gpu_memory_bytes=_opt(d.get("gpu_memory_bytes")),
        rank=d.get("rank"),  # type: ignore[arg-type]
        gpus=tuple(sorted(d.get("gpus", ()), key=_gpu_order)),  # type: ignore[call-overload]
        gpu_simulated=bool(d.get("gpus")) and bool(acc.nodes.get(node, {}).get("simulated")),
    ) for (node, pid), d in acc.procs.items()]
    return sorted(rows, key=lambda p: (p.node, p.pid))


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (_as_int(gpu) or 0, gpu)


def _rank_gpus(processes: Sequence[ProcessRow]) -> dict[int, tuple[tuple[str, str], ...]]:
    """Rank -> the (node, gpu) its worker process holds: NVML lists the process on the GPU,
    the exporter reads the worker's RANK from its environment."""
    out: dict[int, set[tuple[str, str]]] = {}
    for p in processes:
        if p.rank is not None:
            out.setdefault(p.rank, set()).update((p.node, g) for g in p.gpus)
    return {r: tuple(sorted(held, key=lambda k: (k[0], _gpu_order(k[1]))))
            for r, held in out.items() if held}


def _tie_gpus_to_ranks(ranks: list[RankRow], gpus: list[GpuRow],
                       processes: Sequence[ProcessRow]) -> None:
    """Each rank names its GPUs and each GPU its ranks, in place."""
    held = _rank_gpus(processes)
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, keys in held.items():
        for key in keys:
            by_gpu.setdefault(key, []).append(rank)
    for i, r in enumerate(ranks):
        if r.rank in held:
            ranks[i] = replace(r, gpus=tuple(f"{n}/{g}" for n, g in held[r.rank]))
    for i, g in enumerate(gpus):
        if (g.node, g.gpu) in by_gpu:
            gpus[i] = replace(g, ranks=tuple(sorted(by_gpu[g.node, g.gpu])))


def _mean(values: Sequence[float]) -> float | None:
    """The mean, shown as such when a value is not finite: +Inf and -Inf together are NaN
    (statistics.fmean raises on them: fsum refuses -inf + inf)."""
    if not values:
        return None
    if all(math.isfinite(v) for v in values):
        return statistics.fmean(values)
    return sum(values) / len(values)  # inf, -inf or nan, as IEEE arithmetic has it


def _median(values: Iterable[float | None]) -> float | None:
    """Median of the finite values (NaN has no place in an order); None when there are none."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return max(present) if present else None


def _mark_slowest(ranks: list[RankRow], job: dict[str, float]) -> int | None:
    """The job's slowest rank: its own verdict (the lowest straggler score), else the lowest
    published score, else the longest step. Its row is flagged SLOWEST only when it is a
    straggler by the shared line (score below STRAGGLER_SCORE_THRESHOLD), so ranks equal to the
    millisecond are never flagged and the flag does not hop between them from one refresh to
    the next. Step time alone cannot name a compute straggler (every rank's step lasts as long
    as the slowest one's), so it only stands in where no score is published."""
    live = [r for r in ranks if not r.down and r.step_time_s is not None]
    if len(live) < 2:
        return None
    scored = [r for r in live if r.straggler_score is not None]
    slowest = _opt_int(job.get("slowest_rank"))
    if slowest is None or all(r.rank != slowest for r in live):
        slowest = (min(scored, key=lambda r: (r.straggler_score, r.rank)).rank if scored
                   else max(live, key=lambda r: r.step_time_s or 0.0).rank)
    median = statistics.median(r.step_time_s or 0.0 for r in live)
    for i, r in enumerate(ranks):
        # without a published score: the same shape from step times, median ÷ own
        score = r.straggler_score if r.straggler_score is not None else (
            median / r.step_time_s if r.step_time_s else None)
        if r.rank == slowest and score is not None and score < STRAGGLER_SCORE_THRESHOLD:
            ranks[i] = replace(r, slowest=True)
    return slowest


def _carry_down_ranks(ranks: dict[int, RankRow], previous: JobSnapshot | None,
                      now: float) -> None:
    """Ranks seen before whose series are gone now stay listed, marked down (since when)."""
    for old in previous.ranks if previous else ():
        if old.rank not in ranks:
            ranks[old.rank] = replace(old, down=True, stalled=False, slowest=False,
                                      gone_at=old.gone_at if old.down else now)


class JobAggregator:
    """Files scrape results one at a time, in any order, then builds the snapshot.

    Sources add each target's result as it arrives, so filing overlaps the remaining fetches;
    the target list keeps the targets' own order whatever the arrival order.
    """

    def __init__(self) -> None:
        self._acc = _Acc()
        self._results: dict[int, ScrapeResult] = {}
        self._statuses: dict[int, TargetStatus] = {}

    def add(self, index: int, result: ScrapeResult) -> None:
        """Files the result of target number ``index``."""
        self._results[index] = result
        if result.samples is not None:
            self._statuses[index] = _read(self._acc, result)

    def snapshot(
        self, *, now: float, source: str, previous: JobSnapshot | None = None,
        job_name: str = "", logs: tuple[str, ...] = (), log_pod: str = "",
    ) -> JobSnapshot:
        acc = self._acc
        last_node = {t.url: t.node for t in previous.targets} if previous else {}
        targets = [self._statuses.get(i) or _down_status(r, last_node)
                   for i, r in sorted(self._results.items())]
        rank_rows = {r: _rank_row(r, d, now) for r, d in acc.ranks.items()}
        _carry_down_ranks(rank_rows, previous, now)
        ranks = [rank_rows[r] for r in sorted(rank_rows)]
        slowest = _mark_slowest(ranks, acc.job)
        gpus = _gpu_rows(acc, previous, {t.node for t in targets if not t.up and t.node})
        processes = _process_rows(acc)
        _tie_gpus_to_ranks(ranks, gpus, processes)
        return _finish(acc, previous, JobSnapshot(
            time=now, source=source, ranks=tuple(ranks),
            job_name=acc.job_name or job_name or (previous.job_name if previous else ""),
            gpus=tuple(gpus), nodes=tuple(_node_rows(acc, gpus)),
            processes=tuple(processes), targets=tuple(targets),
            slowest_rank=slowest, model=acc.model or (previous.model if previous else ""),
            logs=logs, log_pod=log_pod,
        ))


def _down_status(result: ScrapeResult, last_node: dict[str, str]) -> TargetStatus:
    target = result.target
    return TargetStatus(url=target.url, kind="unknown", up=False, error=result.error,
                        duration_s=result.duration_s, pod=target.pod,
                        node=target.node or last_node.get(target.url, ""))


def aggregate(
    results: Sequence[ScrapeResult],
    *,
    now: float,
    source: str,
    previous: JobSnapshot | None = None,
    job_name: str = "",
    logs: tuple[str, ...] = (),
    log_pod: str = "",
) -> JobSnapshot:
    """Builds the job snapshot from one refresh's scrape results."""
    aggregator = JobAggregator()
    for i, result in enumerate(results):
        aggregator.add(i, result)
    return aggregator.snapshot(now=now, source=source, previous=previous, job_name=job_name,
                               logs=logs, log_pod=log_pod)


def _finish(acc: _Acc, previous: JobSnapshot | None, snap: JobSnapshot) -> JobSnapshot:
    """Header figures, history, alerts and state, from the rows already built."""
    live = [r for r in snap.ranks if not r.down]
    tokens = [r.tokens_per_second for r in live if r.tokens_per_second is not None]
    mfus = [r.mfu_ratio for r in live if r.mfu_ratio is not None]
    losses = [r.loss for r in live if r.loss is not None]
    median = acc.job.get("step_time_median_s", _median(r.step_time_s for r in live))
    step = _max(float(r.step) for r in live if r.step is not None)
    if step is None:  # every rank gone: the furthest any got (a finished job shows its end)
        step = _max(float(r.step) for r in snap.ranks if r.step is not None)
    totals = [d.get("total_steps") for d in acc.ranks.values()]
    total = _opt_int(_max(_opt(t) for t in totals))
    if total is None and previous is not None:  # the plan outlives the ranks that reported it
        total = previous.total_steps
    restarts = _max(_opt(d.get("restarts")) for d in acc.ranks.values())
    world = acc.job.get("world_size") or _max(_opt(d.get("world_size")) for d in acc.ranks.values())
    if world is None and previous is not None:
        world = previous.world_size
    loss = acc.job["loss"] if "loss" in acc.job else _mean(losses)
    tps = sum(tokens) if tokens else None
    history = previous.history if previous else History()
    snap = replace(
        snap, step=_opt_int(step), total_steps=total or None,
        world_size=_opt_int(world) or (len(snap.ranks) or None), tokens_per_second=tps,
        mfu_ratio=_mean(mfus), step_time_median_s=median,
        step_time_max_s=acc.job.get("step_time_max_s", _max(r.step_time_s for r in live)),
        loss=loss, restarts=_opt_int(restarts),
        eta_s=(total - step) * median if total and step is not None and median else None,
        history=History(tokens_per_second=_push(history.tokens_per_second, tps),
                        loss=_push(history.loss, loss),
                        step_time_s=_push(history.step_time_s, median)),
    )
    return settle(replace(snap, alerts=tuple(alerts(snap))), previous)
