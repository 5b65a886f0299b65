"""The one encoder from catalog entries and values to prometheus_client metric families.

Both endpoints build their exposition with it: the in-trainer monitor (fsdpmon/monitor/collector.py)
and the per-node exporter (exporters/collector.py). A custom collector's ``collect()`` returns
``Families.families()``. Bottom layer: imports only the catalog (and prometheus_client), so the
exporter may use it without pulling in the rest of fsdpmon.

Type, help text, label names and unit come from the :class:`~fsdpmon.catalog.Metric`; callers
pass values only. A label count that does not match the catalog is a bug in the caller and
raises ``ValueError`` (prometheus_client would silently pair labels up to the shorter list).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import Metric as Family

from fsdpmon.catalog import Kind, Metric


def printable(value: object, limit: int | None = None) -> str:
    """Untrusted text as a label or a line of evidence may carry it: text only ('' for any
    other value), every unprintable character (a control, an escape, a lone surrogate from
    JSON, which would fail the encoding) as '?', cut to ``limit`` characters."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else "?" for c in value[:limit])

_MAKE = {
    Kind.GAUGE: GaugeMetricFamily,
    Kind.COUNTER: CounterMetricFamily,
    Kind.HISTOGRAM: HistogramMetricFamily,
}


def _new(metric: Metric) -> Family:
    # A unit is declared only when the name ends in it, as OpenMetrics requires.
    unit = metric.unit if metric.unit and metric.family.endswith("_" + metric.unit) else ""
    return _MAKE[metric.kind](metric.family, metric.help, labels=list(metric.labels), unit=unit)


class Families:
    """Metric families created on first use, one per catalog entry, in order of first use."""

    def __init__(self) -> None:
        self._by_name: dict[str, Family] = {}

    def _family(self, metric: Metric, labels: Sequence[str]) -> Family:
        if len(labels) != len(metric.labels):
            raise ValueError(f"{metric.name}: {len(labels)} label values for "
                             f"{len(metric.labels)} labels {metric.labels}")
        family = self._by_name.get(metric.name)
        if family is None:
            family = self._by_name[metric.name] = _new(metric)
        return family

    def add(self, metric: Metric, labels: Sequence[str], value: float) -> None:
        """One gauge or counter sample."""
        if metric.kind is Kind.HISTOGRAM:
            raise ValueError(f"{metric.name} is a histogram: use histogram()")
        self._family(metric, labels).add_metric(list(labels), value)  # type: ignore[attr-defined]

    def histogram(self, metric: Metric, labels: Sequence[str],
                  cumulative: Sequence[tuple[str, float]], total: float) -> None:
        """One histogram sample: ``cumulative`` is ``[(le, count), ...]`` ending in ``+Inf``."""
        if metric.kind is not Kind.HISTOGRAM:
            raise ValueError(f"{metric.name} is not a histogram")
        family = self._family(metric, labels)
        family.add_metric(list(labels), list(cumulative), total)  # type: ignore[attr-defined]

    def families(self) -> list[Family]:
        return list(self._by_name.values())


def restrict(body: bytes, names: set[str] | frozenset[str]) -> bytes:
    """A rendered exposition (text 0.0.4 or OpenMetrics) cut to the samples called ``names``,
    as prometheus_client answers Prometheus's ``name[]`` filter: a family's HELP/TYPE/UNIT
    lines stay when any of its samples does, and ``# EOF`` stays. Both endpoints render
    once and cache, so cutting the cached bytes is cheaper than rendering again."""
    wanted = {n.encode() for n in names}
    out: list[bytes] = []
    header: list[bytes] = []  # the comment lines of the family being read, until one is kept
    family: list[bytes] = []
    for line in body.split(b"\n"):
        if line == b"# EOF":
            out.append(line)
        elif line.startswith(b"#"):
            name = line.split(b" ", 3)[2:3]
            if name != family:
                header, family = [], name
            header.append(line)
        elif line and line.split(b"{", 1)[0].split(b" ", 1)[0] in wanted:
            out.extend(header)
            header = []
            out.append(line)
    return b"".join(piece + b"\n" for piece in out)
