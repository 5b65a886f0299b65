"""PromQL building blocks tied to the metric catalog, and the parser that checks expressions.

Dashboards and rules never spell a catalogued metric name by hand: they pass a catalog symbol
to :func:`m` (or :func:`bucket` for histogram buckets), so a misspelt symbol fails at import.
:func:`metric_names` is the other half of that guarantee: it finds every metric name an
expression selects, so the tests can reject any name the catalog does not define.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from fsdpmon.catalog import Kind, Metric, Recorded
from fsdpmon.conventions import JOB_LABEL

# Grouping labels of job-level figures. Kubernetes scrapes add `namespace`; local runs lack it,
# and PromQL groups a missing label as the empty string, so one rule serves both.
JOB_KEYS = f"namespace, {JOB_LABEL}"
RANK_KEYS = f"namespace, {JOB_LABEL}, rank"


def m(metric: Metric | Recorded, matchers: str = "") -> str:
    """Selector for a catalogued or recorded series, e.g. ``m(catalog.TRAIN_LOSS, 'rank="0"')``."""
    if isinstance(metric, Metric) and metric.kind is Kind.HISTOGRAM:
        raise ValueError(f"{metric.name} is a histogram: select its bucket()")
    return f"{metric.name}{{{matchers}}}" if matchers else metric.name


def _hist(metric: Metric, suffix: str, matchers: str) -> str:
    if metric.kind is not Kind.HISTOGRAM:
        raise ValueError(f"{metric.name} is not a histogram")
    series = metric.name + suffix
    return f"{series}{{{matchers}}}" if matchers else series


def bucket(metric: Metric, matchers: str = "") -> str:
    return _hist(metric, "_bucket", matchers)


# --- parsing -------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<comment>\#[^\n]*)
  | (?P<var>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])     # Grafana variables
  | (?P<number>\d[\w.]*)                       # numbers and durations (5m, 1e3, 0.5)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<punct>[{}()\[\],])
  | (?P<other>\S)
    """,
    re.VERBOSE,
)

# Words followed by a parenthesised list of label names, never metric names.
_LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "inf", "nan", "start", "end",
    # aggregation operators may precede `by (...)` rather than `(`
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}  # fmt: skip


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup or "other"
        if kind != "comment":
            yield kind, match.group()


def metric_names(expr: str) -> set[str]:
    """Every metric name that a PromQL expression selects (Grafana variables allowed).

    Skips label names inside ``{...}`` and after ``by``/``on``/..., function names, keywords,
    strings, durations and range brackets. Raises ValueError on unbalanced brackets, so a
    malformed expression cannot hide a name.
    """
    tokens = list(_tokens(expr))
    names: set[str] = set()
    brace = bracket = 0
    skip_list_depth: int | None = None  # paren depth of a label list being skipped
    paren = 0
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "punct":
            brace += {"{": 1, "}": -1}.get(text, 0)
            bracket += {"[": 1, "]": -1}.get(text, 0)
            if text == "(":
                paren += 1
            elif text == ")":
                paren -= 1
                if skip_list_depth is not None and paren < skip_list_depth:
                    skip_list_depth = None
            if min(brace, bracket, paren) < 0:
                raise ValueError(f"unbalanced brackets in {expr!r}")
            continue
        if kind != "ident" or brace or bracket or skip_list_depth is not None:
            continue
        if text in _LABEL_LIST_KEYWORDS:
            if nxt == "(":
                skip_list_depth = paren + 1
            continue
        if text in _KEYWORDS or nxt == "(":
            continue
        names.add(text)
    if brace or bracket or paren:
        raise ValueError(f"unbalanced brackets in {expr!r}")
    return names
