"""Small typed builders for Grafana dashboard JSON: targets, panels, rows, variables, layout.

Only the parts of Grafana's dashboard model that fsdpmon uses. The JSON is Grafana's dashboard
model of the releases in GRAFANA_VERSIONS: tests/test_dashboards.py validates every dashboard
against each one's schema (tests/schemas/grafana-<version>.json, from its @grafana/schema).
Every panel and variable reads the datasource from the ``$datasource`` variable, so one JSON file
works against any Prometheus the user picks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fsdpmon.dashboards.descriptions import DESCRIPTIONS

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
# The Grafana releases supported: the oldest (12.4) and the newest checked (13.2). The JSON
# keeps schemaVersion 39, which both load (and migrate as they load it).
GRAFANA_VERSIONS = ("12.4.11", "13.2.3")
SCHEMA_VERSION = 39

Json = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False  # tables and stats of current values
    table: bool = False  # Grafana "table" format: one column per label

    def to_json(self, ref_id: str) -> Json:
        return {
            "datasource": DATASOURCE,
            "refId": ref_id,
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "instant": self.instant,
            "range": not self.instant,
            "format": "table" if self.table else "time_series",
            "editorMode": "code",
        }


@dataclass(frozen=True)
class Panel:
    """A visualisation: ``kind`` is Grafana's panel type (timeseries, stat, table, ...)."""

    title: str
    kind: str
    targets: tuple[Target, ...]
    unit: str = "short"
    description: str = ""
    width: int = 8
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: tuple[tuple[float | None, str], ...] = ((None, "green"),)
    options: Mapping[str, Any] = field(default_factory=dict)
    custom: Mapping[str, Any] = field(default_factory=dict)
    transformations: tuple[Mapping[str, Any], ...] = ()

    def to_json(self, panel_id: int, x: int, y: int) -> Json:
        defaults: Json = {
            "unit": self.unit,
            "thresholds": {"mode": "absolute", "steps": [
                {"value": value, "color": color} for value, color in self.thresholds
            ]},
            "custom": dict(self.custom),
        }
        if self.min is not None:
            defaults["min"] = self.min
        if self.max is not None:
            defaults["max"] = self.max
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description or DESCRIPTIONS[self.title],
            "datasource": DATASOURCE,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "targets": [t.to_json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": dict(self.options),
            "transformations": [dict(t) for t in self.transformations],
        }


@dataclass(frozen=True)
class Row:
    """A full-width section title; panels after it belong to it."""

    title: str


def timeseries(title: str, *targets: Target, unit: str = "short", description: str = "",
               width: int = 8, stack: bool = False, threshold_lines: bool = False,
               **kw: Any) -> Panel:
    """Lines over time; ``threshold_lines`` draws each threshold step as a dashed line."""
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                              "spanNulls": False}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    if threshold_lines:
        custom["thresholdsStyle"] = {"mode": "dashed"}
    options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return Panel(title, "timeseries", targets, unit, description, width, custom=custom,
                 options=options, **kw)


def stat(title: str, *targets: Target, unit: str = "short", description: str = "",
         width: int = 4, height: int = 4, **kw: Any) -> Panel:
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "colorMode": "value", "graphMode": "area", "textMode": "auto",
               "justifyMode": "auto", "orientation": "auto"}
    return Panel(title, "stat", targets, unit, description, width, height, options=options, **kw)


def table(title: str, *targets: Target, unit: str = "short", description: str = "",
          width: int = 24, height: int = 8, **kw: Any) -> Panel:
    """Instant table; several targets are merged on their common labels."""
    instant = tuple(Target(t.expr, t.legend, instant=True, table=True) for t in targets)
    transforms: tuple[Mapping[str, Any], ...] = ({"id": "merge", "options": {}},)
    if len(targets) == 1:
        transforms = ()
    transforms += ({"id": "organize", "options": {"excludeByName": {"Time": True}}},)
    options = {"showHeader": True, "cellHeight": "sm"}
    custom = {"cellOptions": {"type": "auto"}}  # Grafana's default cell, which its schema asks for
    return Panel(title, "table", instant, unit, description, width, height, options=options,
                 custom=custom, transformations=transforms, **kw)


def heatmap(title: str, target: Target, unit: str = "short", description: str = "",
            width: int = 12, **kw: Any) -> Panel:
    """One row per series (e.g. per rank), coloured by value: no bucketing by Grafana."""
    options = {"calculate": False, "yAxis": {"axisPlacement": "left"},
               "rowsFrame": {"layout": "auto"},
               # Grafana's defaults but for the mode: its schema asks for the whole object
               "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64,
                         "fill": "dark-orange", "exponent": 0.5, "reverse": False},
               "cellGap": 1, "legend": {"show": True},
               "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False}}
    return Panel(title, "heatmap", (target,), unit, description, width, options=options, **kw)


def bars(title: str, *targets: Target, unit: str = "short", description: str = "",
         width: int = 12, **kw: Any) -> Panel:
    """Bar gauge of current values, one bar per series (e.g. per job, per rank)."""
    instant = tuple(Target(t.expr, t.legend, instant=True) for t in targets)
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
               "orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
               # the bar gauge's default legend (hidden), which Grafana's schema asks for
               "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom",
                          "calcs": []}}
    return Panel(title, "bargauge", instant, unit, description, width, options=options, **kw)


def query_variable(name: str, label: str, query: str, *, include_all: bool = True) -> Json:
    """A multi-select variable from ``label_values(...)``; "All" matches a missing label too."""
    current = ({"selected": True, "text": ["All"], "value": ["$__all"]} if include_all
               else {"selected": False, "text": "", "value": ""})
    return {
        "type": "query", "name": name, "label": label, "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2, "includeAll": include_all, "allValue": ".*", "multi": True,
        "sort": 3 if name == "rank" else 1, "current": current, "options": [], "hide": 0,
        "regex": "",
    }


def datasource_variable() -> Json:
    return {"type": "datasource", "name": "datasource", "label": "Data source",
            "query": "prometheus", "current": {"selected": False, "text": "default",
                                               "value": "default"},
            "options": [], "hide": 0, "refresh": 1,
            "regex": ""}


def layout(items: Sequence[Panel | Row]) -> list[Json]:
    """Place panels left to right, wrapping at the grid width; rows start a new line."""
    out: list[Json] = []
    x = y = line_height = 0
    for panel_id, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y += line_height
            out.append({"id": panel_id, "type": "row", "title": item.title, "collapsed": False,
                        "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
            x, y, line_height = 0, y + 1, 0
            continue
        if x + item.width > GRID_WIDTH:
            x, y, line_height = 0, y + line_height, 0
        out.append(item.to_json(panel_id, x, y))
        x += item.width
        line_height = max(line_height, item.height)
    return out


def dashboard(uid: str, title: str, description: str, items: Sequence[Panel | Row],
              variables: Sequence[Json], links: Sequence[Json] = ()) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["fsdpmon"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: line ranks, GPUs and phases up in time
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "links": list(links),
        "annotations": {"list": []},
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": layout(items),
    }


_LABEL_VALUES = re.compile(r"label_values\((?P<selector>.*),\s*(?P<label>\w+)\)")


def variable_selector(variable: Json) -> tuple[str, str]:
    """A query variable's ``label_values(SELECTOR, LABEL)`` -> (SELECTOR, LABEL); ValueError for
    any other query."""
    query = variable["query"]["query"]
    match = _LABEL_VALUES.fullmatch(query.strip())
    if not match:
        raise ValueError(f"not a label_values() query: {query!r}")
    return match["selector"], match["label"]


# Grafana's built-in interval variables, with values a dashboard typically gets.
BUILTIN_DEFAULTS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` as Grafana does, before the query reaches Prometheus.

    ``values`` maps variable names (``job``, ``__range``...) to their rendered text; a variable
    with no value raises KeyError, so no ``$`` ever reaches Prometheus unnoticed.
    """
    merged = {**BUILTIN_DEFAULTS, **values}

    def one(match: re.Match[str]) -> str:
        return merged[match["braced"] or match["plain"]]

    return re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<plain>[A-Za-z_]\w*))", one, expr)


def expressions(dash: Json) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel query and variable selector of a dashboard JSON."""
    found = [(f"variable {v['name']}", variable_selector(v)[0])
             for v in dash["templating"]["list"] if v["type"] == "query"]
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return found
