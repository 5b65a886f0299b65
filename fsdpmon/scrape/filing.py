"""Filing one target's samples into the refresh's accumulators: the hot path of a refresh.

A 256-node job sends ~90k samples per refresh. Each sample's name is looked up once, in one
table, for the row kind and field it fills. The parser shares one label dict between the series
of a rank (or a GPU, or a process), so rows are memoised by that dict's identity and most
samples cost two dict lookups and a store.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from fsdpmon.conventions import GPU_CLOCK_EVENT_BITS, JOB_LABEL, LOCAL_RANK_LABEL, RANK_LABEL
from fsdpmon.job.snapshot import TargetStatus
from fsdpmon.scrape.expfmt import Sample
from fsdpmon.scrape.frozen import maker
from fsdpmon.scrape.wanted import (
    EXPORTER_INFO,
    GPU_CLOCK_EVENT,
    GPU_ECC,
    GPU_EVENTS,
    GPU_METRICS,
    GPU_PROCESS_MEMORY,
    GPU_XID,
    HOST_CPU,
    HOST_METRICS,
    JOB_METRICS,
    PROCESS_INFO,
    PROCESS_METRICS,
    PROCESS_STATE,
    RANK_LABELLED,
    RANK_METRICS,
    TRAIN_INFO,
)


@dataclass(frozen=True)
class Target:
    """Where one scrape came from; pod/node/namespace are known for Kubernetes targets."""

    url: str
    pod: str = ""
    node: str = ""
    namespace: str = ""


@dataclass(frozen=True)
class Filed:
    """What was filed of a target's body while it was read (fused.FilingParser); its other
    samples are the result's ``samples``."""

    samples: int
    train: bool  # a rank's or the job's figure
    exporter: bool  # a GPU's figure
    node: str = ""  # the node label of the last GPU series


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    samples: Sequence[Sample] | None  # None when the target did not answer
    error: str = ""
    duration_s: float = 0.0
    filed: Filed | None = None


# Made for every target of every refresh: without the frozen guard's setattr per field.
new_result, _new_status = maker(ScrapeResult), maker(TargetStatus)

Row = dict[str, object]


@dataclass
class Acc:
    """Mutable accumulators for one refresh."""

    ranks: dict[int, Row] = field(default_factory=dict)
    job: dict[str, float] = field(default_factory=dict)
    gpus: dict[tuple[str, str], Row] = field(default_factory=dict)
    nodes: dict[str, Row] = field(default_factory=dict)
    procs: dict[tuple[str, int], Row] = field(default_factory=dict)
    job_name: str = ""
    model: str = ""
    # id(labels) -> row, one memo per kind: the same dict may label a rank and a GPU series
    rank_memo: dict[int, Row | None] = field(default_factory=dict)
    gpu_memo: dict[int, Row] = field(default_factory=dict)
    # The label dicts the memos are keyed by, held so that none of those ids is reused while
    # the memos live (a parser that empties its caches mid-refresh frees its dicts).
    memo_labels: list[dict[str, str]] = field(default_factory=list)


def as_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


# The kinds of row a series fills; the table gives (kind, field) for every name top reads.
# The three of a rank's row come first (file_result tests ``kind <= _EXIT``), a name top does
# not read last.
_RANK, _INFO, _EXIT, _JOB, _GPU, _EVENT, _PROC, _HOST, _OTHER = range(1, 10)
_KIND: dict[str, tuple[int, str]] = {
    **{name: (_RANK, key) for name, key in RANK_METRICS.items()},
    TRAIN_INFO: (_INFO, ""),
    # how a restarted rank's previous life ended, the call site of its pattern break: a label
    **{name: (_EXIT, name) for name in RANK_LABELLED},
    **{name: (_JOB, key) for name, key in JOB_METRICS.items()},
    **{name: (_GPU, key) for name, key in GPU_METRICS.items()},
    **{name: (_EVENT, "") for name in GPU_EVENTS},
    **{name: (_PROC, key) for name, key in PROCESS_METRICS.items()},
    PROCESS_INFO: (_PROC, ""), PROCESS_STATE: (_PROC, ""), GPU_PROCESS_MEMORY: (_PROC, ""),
    **{name: (_HOST, key) for name, key in HOST_METRICS.items()},
    HOST_CPU: (_HOST, ""), EXPORTER_INFO: (_HOST, ""),
}
_NONE = (_OTHER, "")
# The names whose samples are a figure stored under a field of one row (a rank's, a GPU's, the
# job's): what fused.FilingParser files as it reads.
STORED = {name: kind_key for name, kind_key in _KIND.items()
          if kind_key[0] in (_RANK, _GPU, _JOB)}
RANK_KIND, GPU_KIND, JOB_KIND = _RANK, _GPU, _JOB  # the kinds of row a STORED name fills


def row_of(acc: Acc, kind: int, labels: dict[str, str], target: Target) -> Row | None:
    """The row a STORED name's series with these labels is stored in, as file_result finds
    it (None: a rank series without a rank)."""
    if kind == _RANK:
        row = acc.rank_memo.get(id(labels), acc.rank_memo)
        return _rank_entry(acc, labels, target) if row is acc.rank_memo else row
    if kind == _GPU:
        return acc.gpu_memo.get(id(labels)) or _gpu_entry(acc, labels)
    return acc.job


def _rank_entry(acc: Acc, labels: dict[str, str], target: Target) -> Row | None:
    rank = as_int(labels.get(RANK_LABEL, ""))
    row = None
    if rank is not None:
        row = acc.ranks.get(rank)
        if row is None:
            row = acc.ranks[rank] = {"pod": target.pod, "node": target.node,
                                     "target": target.url,
                                     "local_rank": as_int(labels.get(LOCAL_RANK_LABEL, ""))}
            acc.job_name = acc.job_name or labels.get(JOB_LABEL, "")
    acc.rank_memo[id(labels)] = row
    acc.memo_labels.append(labels)
    return row


def _add_info(acc: Acc, row: Row, labels: dict[str, str]) -> None:
    row["node"] = labels.get("node") or row["node"]
    row["world_size"] = as_int(labels.get("world_size", ""))
    acc.model = acc.model or labels.get("model", "")


_GPU_ATTRIBUTES = ("model", "uuid", "namespace", "pod", "container")


def _gpu_entry(acc: Acc, labels: dict[str, str]) -> Row:
    key = labels.get("node", ""), labels.get("gpu", "")
    gpu = acc.gpus.get(key)
    if gpu is None:
        gpu = acc.gpus[key] = {}
    for name in _GPU_ATTRIBUTES:
        value = labels.get(name)
        if value:
            gpu[name] = value
    acc.gpu_memo[id(labels)] = gpu
    acc.memo_labels.append(labels)
    return gpu


def _add_gpu_event(gpu: Row, name: str, labels: dict[str, str], value: float) -> None:
    """Throttle reasons active now, XID counts by code, uncorrected ECC count."""
    if name == GPU_CLOCK_EVENT:
        if value:
            gpu.setdefault("clock_events", []).extend(clock_event_reasons(value))  # type: ignore[union-attr]
    elif name == GPU_XID:
        gpu.setdefault("xid_counts", []).append((labels.get("xid", ""), value))  # type: ignore[union-attr]
    elif name == GPU_ECC and labels.get("type") == "uncorrected":
        gpu["ecc_uncorrected"] = value


@functools.lru_cache(maxsize=64)  # a handful of masks, each seen on many GPUs
def clock_event_reasons(mask: float) -> tuple[str, ...]:
    """The reasons set in NVML's clock-event bitmask, by name; none for a value that is no
    such mask (negative, fractional, not finite or past 32 bits: what a pod serves is
    untrusted), and bits without a name are not shown."""
    if not 0 < mask < 2**32 or mask != int(mask):  # NaN fails both comparisons
        return ()
    bits = int(mask)
    return tuple(reason for reason, bit in GPU_CLOCK_EVENT_BITS.items() if bits & bit)


def _add_host(acc: Acc, name: str, key: str, labels: dict[str, str], value: float,
              node: str) -> None:
    host = acc.nodes.setdefault(node, {})
    if key:
        host[key] = value
    elif name == EXPORTER_INFO:
        host["simulated"] = labels.get("simulated", "").lower() in ("true", "1", "yes")
    elif labels.get("cpu") == "all":  # HOST_CPU
        host["cpu_utilization_ratio"] = value


_PROCESS_OWNER = ("namespace", "pod", "container")


def _process_entry(acc: Acc, labels: dict[str, str], node: str) -> Row | None:
    pid = as_int(labels.get("pid", ""))
    if pid is None:
        return None
    proc = acc.procs.get((node, pid))
    if proc is None:  # a process's series all carry its pod: read it from the first one
        proc = acc.procs[node, pid] = {key: labels[key] for key in _PROCESS_OWNER
                                       if labels.get(key)}
    return proc


def _add_process(proc: Row, name: str, key: str, labels: dict[str, str], value: float) -> None:
    if key:
        proc[key] = value
    elif name == PROCESS_INFO:
        proc["command"] = labels.get("command", "")
        proc["user"] = labels.get("user", "")
        proc["rank"] = as_int(labels.get("rank", ""))
    elif name == PROCESS_STATE:
        if value == 1:
            proc["state"] = labels.get("state", "")
    else:  # GPU_PROCESS_MEMORY
        proc["gpu_memory_bytes"] = float(proc.get("gpu_memory_bytes", 0.0)) + value  # type: ignore[arg-type]
        proc.setdefault("gpus", set()).add(labels.get("gpu", ""))  # type: ignore[union-attr]


def file_result(acc: Acc, result: ScrapeResult) -> TargetStatus:
    """Files one target's samples into the accumulators; returns the target's status."""
    target = result.target
    filed = result.filed or _NOTHING_FILED
    samples = result.samples or ()
    train, exporter, node = _file_samples(acc, samples, target, filed.train, filed.exporter,
                                          filed.node or target.node)
    kind_name = "train" if train else "exporter" if exporter else "unknown"
    return _new_status(url=target.url, kind=kind_name, up=True, duration_s=result.duration_s,
                       samples=filed.samples + len(samples), pod=target.pod, node=node)


def _file_samples(acc: Acc, samples: Sequence[Sample], target: Target, train: bool,
                  exporter: bool, node: str) -> tuple[bool, bool, str]:
    """file_result's loop: whether a rank's and a GPU's figures were among them, and the node
    the target is known by after them."""
    rank_memo, gpu_memo, kinds = acc.rank_memo, acc.gpu_memo, _KIND
    # Process rows are keyed by node and pid, the node maybe the target's: memoised per target
    # and per node the target is known by.
    proc_memo: dict[int, Row | None] = {}
    memo_node = node
    for name, labels, value in samples:
        kind, key = kinds.get(name, _NONE)
        if kind <= _EXIT:  # a rank's series: _RANK, _INFO or _EXIT
            train = True
            row = rank_memo.get(id(labels), rank_memo)
            if row is rank_memo:
                row = _rank_entry(acc, labels, target)
            if row is None:
                continue
            if kind == _INFO:
                _add_info(acc, row, labels)
            elif kind == _EXIT:
                if value == 1.0:
                    field_name, label = RANK_LABELLED[key]
                    row[field_name] = labels.get(label, "")
            else:
                row[key] = value
        elif kind == _GPU:
            gpu = gpu_memo.get(id(labels))
            if gpu is None:
                gpu = _gpu_entry(acc, labels)
            gpu[key] = value
            node, exporter = labels.get("node") or node, True
        elif kind == _EVENT:
            gpu = gpu_memo.get(id(labels)) or _gpu_entry(acc, labels)
            _add_gpu_event(gpu, name, labels, value)
            exporter = True
        elif kind == _PROC:
            if node != memo_node:  # rows of series without a node label are on the target's
                proc_memo.clear()
                memo_node = node
            proc = proc_memo.get(id(labels), proc_memo)
            if proc is proc_memo:
                proc = proc_memo[id(labels)] = _process_entry(acc, labels,
                                                              labels.get("node") or node)
            if proc is not None:
                _add_process(proc, name, key, labels, value)
            exporter = True
        elif kind == _JOB:
            acc.job[key] = value
            train = True
        elif kind == _HOST:
            node = labels.get("node") or node
            _add_host(acc, name, key, labels, value, node)
            exporter = True
    return train, exporter, node


_NOTHING_FILED = Filed(0, False, False)
