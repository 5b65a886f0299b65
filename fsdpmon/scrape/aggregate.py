"""Parsed samples from many targets → one JobSnapshot: files each target's samples as it
arrives (filing), builds the rows (rows), then the header figures, history and state.

The previous snapshot is passed in to carry history (sparklines) and to remember ranks and GPUs
whose target went quiet, so a pod that stops answering is shown as down instead of vanishing.
The names top reads live in wanted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import replace

from fsdpmon.job.health import settle
from fsdpmon.job.snapshot import History, JobSnapshot, TargetStatus
from fsdpmon.scrape.filing import Acc, ScrapeResult, Target, file_result  # noqa: F401 - Target re-exported
from fsdpmon.scrape.rows import (
    carry_down_ranks,
    carry_processes,
    gpu_rows,
    mark_slowest,
    node_rows,
    opt_int,
    process_rows,
    push,
    rank_row,
    ties,
)


class JobAggregator:
    """Files scrape results one at a time, in any order, then builds the snapshot.

    Sources add each target's result as it arrives, so filing overlaps the remaining fetches;
    the target list keeps the targets' own order whatever the arrival order.
    """

    def __init__(self) -> None:
        self._acc = Acc()
        self._down: dict[int, ScrapeResult] = {}
        self._statuses: dict[int, TargetStatus] = {}

    @property
    def acc(self) -> Acc:
        """The accumulators results are filed into (what a FilingParser files into)."""
        return self._acc

    def add(self, index: int, result: ScrapeResult) -> None:
        """Files the result of target number ``index``."""
        if result.samples is None:
            self._down[index] = result
        else:
            self._statuses[index] = file_result(self._acc, result)

    def snapshot(
        self, *, now: float, source: str, previous: JobSnapshot | None = None,
        job_name: str = "", logs: tuple[str, ...] = (), log_pod: str = "",
        processes_asked: bool = True,
    ) -> JobSnapshot:
        """The job's snapshot (once per aggregator: the rows take its accumulators over).
        Without ``processes_asked`` (a refresh that did not ask for the process families),
        each node whose exporter answered without process figures keeps its process rows of
        ``previous``."""
        acc = self._acc
        last_node = {t.url: t.node for t in previous.targets} if previous else {}
        targets = [self._statuses.get(i) or _down_status(self._down[i], last_node)
                   for i in sorted(self._statuses.keys() | self._down.keys())]
        processes = tuple(process_rows(acc))
        if not processes_asked and previous is not None:
            processes = carry_processes(processes, previous, targets)
        gpus_of, ranks_on = ties(processes)
        rank_rows = {r: rank_row(r, d, now, gpus_of.get(r, ())) for r, d in acc.ranks.items()}
        carry_down_ranks(rank_rows, previous, now, gpus_of)
        ranks = [rank_rows[r] for r in sorted(rank_rows)]
        slowest = mark_slowest(ranks, acc.job)
        gpus = gpu_rows(acc, previous, {t.node for t in targets if not t.up and t.node}, ranks_on)
        return _finish(acc, previous, JobSnapshot(
            time=now, source=source, ranks=tuple(ranks),
            job_name=acc.job_name or job_name or (previous.job_name if previous else ""),
            gpus=tuple(gpus), nodes=tuple(node_rows(acc, gpus)),
            processes=processes, targets=tuple(targets),
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
    processes_asked: bool = True,
) -> JobSnapshot:
    """Builds the job snapshot from one refresh's scrape results (``processes_asked``: as
    JobAggregator.snapshot takes it)."""
    aggregator = JobAggregator()
    for i, result in enumerate(results):
        aggregator.add(i, result)
    return aggregator.snapshot(now=now, source=source, previous=previous, job_name=job_name,
                               logs=logs, log_pod=log_pod, processes_asked=processes_asked)


def _finish(acc: Acc, previous: JobSnapshot | None, snap: JobSnapshot) -> JobSnapshot:
    """Header figures, history and state, from the rows already built."""
    live = [r for r in snap.ranks if not r.down]
    tokens = [r.tokens_per_second for r in live if r.tokens_per_second is not None]
    mfus = [r.mfu_ratio for r in live if r.mfu_ratio is not None]
    losses = [r.loss for r in live if r.loss is not None]
    # The job's own figures where it publishes them, else the ranks' (each pass over 2048 ranks
    # is made only when needed); accumulated figures are floats as parsed (or ints), NaN kept
    # out of every max and median.
    median = acc.job.get("step_time_median_s")
    if median is None:
        median = _median(r.step_time_s for r in live)
    step = _max(r.step for r in live)  # a step is an int or None
    if step is None:  # every rank gone: the furthest any got (a finished job shows its end)
        step = _max(r.step for r in snap.ranks)
    ranks = acc.ranks.values()
    total = opt_int(_max(d.get("total_steps") for d in ranks))
    if total is None and previous is not None:  # the plan outlives the ranks that reported it
        total = previous.total_steps
    restarts = _max(d.get("restarts") for d in ranks)
    world = acc.job.get("world_size") or _max(d.get("world_size") for d in ranks)
    if world is None and previous is not None:
        world = previous.world_size
    loss = acc.job["loss"] if "loss" in acc.job else _mean(losses)
    tps = sum(tokens) if tokens else None
    history = previous.history if previous else History()
    snap = replace(
        snap, step=opt_int(step), total_steps=total or None,
        world_size=opt_int(world) or (len(snap.ranks) or None), tokens_per_second=tps,
        mfu_ratio=_mean(mfus), step_time_median_s=median,
        step_time_max_s=most if (most := acc.job.get("step_time_max_s")) is not None
        else _max(r.step_time_s for r in live),
        loss=loss, restarts=opt_int(restarts),
        goodput_ratio=_max(d.get("goodput_ratio") for d in ranks),
        eta_s=(total - step) * median if total and step is not None and median else None,
        history=History(tokens_per_second=push(history.tokens_per_second, tps),
                        loss=push(history.loss, loss),
                        step_time_s=push(history.step_time_s, median)),
    )
    return settle(snap, previous)


def _mean(values: Sequence[float]) -> float | None:
    """The mean, shown as such when a value is not finite: +Inf and -Inf together are NaN
    (statistics.fmean raises on them: fsum refuses -inf + inf)."""
    if not values:
        return None
    if all(math.isfinite(v) for v in values):
        try:
            return statistics.fmean(values)
        except OverflowError:  # fsum's exact sum passed float's limit: scale each value first
            return sum(v / len(values) for v in values)
    return sum(values) / len(values)  # inf, -inf or nan, as IEEE arithmetic has it


def _median(values: Iterable[float | None]) -> float | None:
    """Median of the finite values (NaN has no place in an order); None when there are none."""
    present = [v for v in values if v is not None and v == v]  # NaN is not equal to itself
    return statistics.median(present) if present else None


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and v == v]  # NaN is not equal to itself
    return max(present) if present else None

