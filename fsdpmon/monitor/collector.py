"""The prometheus_client collector that serves every live local rank from the shared state files.

It yields fresh metric families on each scrape, built from the catalog, so a rank that died
(its PID gone) simply is not there, and the heartbeat age is computed at scrape time — a rank
frozen by SIGSTOP still shows its age growing and is reported stalled even though its own
watchdog thread cannot run. It runs in the pod's server process (``podserver``), never in a
rank, so a stopped rank is judged by the others' server: unresponsive, the rest served.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fsdpmon import catalog
from fsdpmon.catalog import BY_NAME, Kind
from fsdpmon.conventions import EXIT_HOWS, PROGRESS_PHASES, UNRESPONSIVE_AFTER_SECONDS
from fsdpmon.families import Families
from fsdpmon.monitor.fingerprint import BREAK_SITE, site_label
from fsdpmon.monitor.heartbeat import Heartbeat, stopped
from fsdpmon.monitor.state import RankState, read_job_states

log = logging.getLogger(__name__)


INFO_LABELS = catalog.TRAIN_INFO.labels[3:]


class JobStateCollector(Collector):
    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        states = read_job_states(self.directory)
        return iter(build_families(states, self.clock()))

    def describe(self) -> Iterable[Metric]:
        return []  # the series set changes per scrape; nothing to pre-register


def build_families(states: list[RankState], now: float) -> list[Metric]:
    """Pure: every live rank's series as catalogued metric families."""
    builder = Families()
    for state in states:
        try:
            _add_rank(builder, state, now)
        except (TypeError, ValueError, AttributeError, KeyError):
            # A state file this code did not foresee: skip that rank, serve the others.
            log.debug("fsdpmon: skipping unreadable state of rank %s", state.rank, exc_info=True)
    for state in states:
        job = state.snapshot.get("job")
        if isinstance(job, dict):
            job_name = str(state.snapshot.get("job_name", ""))
            for name, value in _mapping(job).items():
                _add(builder, name, (job_name,), value)
            break  # only rank 0 publishes job figures
    return builder.families()


def _add_rank(builder: Families, state: RankState, now: float) -> None:
    snap, hb = state.snapshot, state.heartbeat
    labels = (str(snap.get("job_name", "")), str(state.rank), str(snap.get("local_rank", "")))
    info = _mapping(snap.get("info"))
    builder.add(catalog.TRAIN_INFO, (*labels, *(str(info.get(k, "")) for k in INFO_LABELS)), 1.0)
    started = _number(snap.get("started_unix"))
    started = started if started is not None and math.isfinite(started) else now
    last = hb.last_step_unix if hb.last_step_unix > 0 else None
    age = max(0.0, now - (last or started))
    threshold = hb.stall_threshold
    # Like the watchdog, judge stalls only once a step has completed (set-up can be long).
    overdue = last is not None and threshold > 0 and age > threshold
    stalled = 1.0 if hb.stalled or overdue else 0.0
    live = {
        catalog.TRAIN_STEPS_TOTAL.name: hb.steps_total,
        catalog.TRAIN_STEP.name: hb.step,
        catalog.TRAIN_TOKENS_TOTAL.name: hb.tokens_total,
        catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS.name: last,
        catalog.TRAIN_HEARTBEAT_AGE_SECONDS.name: age,
        catalog.TRAIN_STALLED.name: stalled,
        catalog.TRAIN_STALL_THRESHOLD_SECONDS.name: threshold if threshold > 0 else None,
        catalog.TRAIN_UNRESPONSIVE.name: _unresponsive(hb, started, now),
    }
    for name, value in {**_mapping(snap.get("values")), **live}.items():
        _add(builder, name, labels, value)
    for key, name in (("phase_totals", catalog.TRAIN_PHASE_SECONDS_TOTAL.name),
                      ("phase_means", catalog.TRAIN_PHASE_DURATION_SECONDS.name),
                      ("badput_totals", catalog.TRAIN_BADPUT_SECONDS_TOTAL.name)):
        for phase, value in _mapping(snap.get(key)).items():
            _add(builder, name, (*labels, str(phase)), value)
    _position(builder, labels, hb)
    site = site_label(snap.get(BREAK_SITE))
    if site:  # the last pattern break's call site (its figures are among the values)
        builder.add(catalog.TRAIN_COLLECTIVE_BREAK_SITE_INFO, (*labels, site), 1.0)
    how = snap.get("previous_exit")
    if how in EXIT_HOWS:  # a bounded label: anything else in the file is not served
        _add(builder, catalog.TRAIN_PREVIOUS_EXIT.name, (*labels, how), 1.0)
    hist = snap.get("histogram")
    if isinstance(hist, dict):
        _histogram(builder, labels, hist)


def _position(builder: Families, labels: tuple[str, ...], hb: Heartbeat) -> None:
    """The progress evidence (only once the rank publishes it: an older monitor's record, or
    a rank that has not beaten yet, has no phase)."""
    phase = int(hb.phase) if math.isfinite(hb.phase) else -1
    if not 0 <= phase < len(PROGRESS_PHASES) or hb.position_since_unix <= 0:
        return
    for name, value in ((catalog.TRAIN_COLLECTIVE_ENTERED_SEQ, hb.collective_entered),
                        (catalog.TRAIN_COLLECTIVE_COMPLETED_SEQ, hb.collective_completed),
                        (catalog.TRAIN_IN_COLLECTIVE, 1.0 if hb.in_collective else 0.0),
                        (catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS,
                         hb.position_since_unix)):
        builder.add(name, labels, value)
    for i, name in enumerate(PROGRESS_PHASES):
        builder.add(catalog.TRAIN_PHASE, (*labels, name), 1.0 if i == phase else 0.0)
    if hb.step_calls >= 0:  # the fingerprint of the step it names (none before a step)
        for name, value in ((catalog.TRAIN_STEP_COLLECTIVE_CALLS, hb.step_calls),
                            (catalog.TRAIN_STEP_COLLECTIVE_FINGERPRINT, hb.step_fingerprint),
                            (catalog.TRAIN_STEP_COLLECTIVE_END_SEQ, hb.step_end_seq)):
            builder.add(name, labels, value)
    if hb.entered_op > 0:  # the call entered last (none before the first, or older writer)
        for name, value in ((catalog.TRAIN_COLLECTIVE_ENTERED_OP, hb.entered_op),
                            (catalog.TRAIN_COLLECTIVE_ENTERED_ELEMENTS, hb.entered_elements),
                            (catalog.TRAIN_COLLECTIVE_ENTERED_DTYPE, hb.entered_dtype),
                            (catalog.TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN,
                             hb.entered_off_pattern)):
            builder.add(name, labels, value)


def _unresponsive(hb: Heartbeat, started: float, now: float) -> float:
    """1 when the rank's process is stopped (the kernel says so at once) or its watchdog thread
    has not ticked for UNRESPONSIVE_AFTER_SECONDS (stopped, or holding the GIL), counted from
    the monitor's start until its first tick (it ticks once a second from then on)."""
    if stopped(hb.pid):
        return 1.0
    last = hb.watchdog_unix if hb.watchdog_unix > 0 else started
    return float(now - last > UNRESPONSIVE_AFTER_SECONDS)


def _add(out: Families, name: str, labels: tuple[str, ...], value: Any) -> None:
    """One value from a state file: names it does not catalogue and non-numbers are skipped."""
    metric = BY_NAME.get(name)
    number = _number(value)
    if metric is None or number is None or metric.kind is Kind.HISTOGRAM:
        return
    if len(labels) == len(metric.labels):
        out.add(metric, labels, number)


def _histogram(out: Families, labels: tuple[str, ...], hist: dict[str, Any]) -> None:
    """Per-bucket counts from the state file -> the cumulative buckets Prometheus serves."""
    bounds = catalog.TRAIN_STEP_DURATION_SECONDS.buckets
    counts = hist.get("counts")
    total = _number(hist.get("sum"))
    if not isinstance(counts, list) or len(counts) != len(bounds) + 1:
        return
    numbers = [_number(c) for c in counts]
    if any(n is None or not math.isfinite(n) or n < 0 for n in numbers):
        return
    cumulative, running = [], 0.0
    for bound, count in zip((*bounds, math.inf), numbers, strict=True):
        running += count or 0.0
        cumulative.append((_le(bound), running))
    out.histogram(catalog.TRAIN_STEP_DURATION_SECONDS, labels, cumulative, total or 0.0)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)  # NaN/Inf included: a non-finite loss is published as such
    return None
