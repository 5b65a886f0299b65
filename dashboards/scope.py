"""What the fsdpmon dashboards share: their variables, the selectors and legends built on them,
and the links between the dashboards.

Variables: ``datasource``, ``namespace``, ``job`` (the ``job_name`` label), ``node`` and ``rank``.
Every filter is a regex match with "All" = ``.*``, which also matches a missing label, so the
same dashboards work for Kubernetes scrapes (with ``namespace``) and local runs (without).
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.dashboards.panels import Json, query_variable
from fsdpmon.dashboards.promql import m

JOB = 'namespace=~"$namespace", job_name=~"$job"'
RANK = f'{JOB}, rank=~"$rank"'
NODE = 'node=~"$node"'
NODE_ALL = 'node=~".+"'  # dashboards without a node variable
RATE = "$__rate_interval"
RANGE = "$__range"

PER_JOB = "{{namespace}} {{job_name}}"
PER_RANK = "rank {{rank}}"


def variables(*names: str) -> list[Json]:
    """The dashboard variables ``names``, in that order, each a query over the catalog."""
    info = m(catalog.TRAIN_INFO)
    queries = {
        "namespace": ("Namespace", f"label_values({info}, namespace)"),
        "job": ("Job", f'label_values({info}{{namespace=~"$namespace"}}, job_name)'),
        "node": ("Node", f"label_values({m(catalog.GPU_UTILIZATION_RATIO)}, node)"),
        "rank": ("Rank", f"label_values({info}{{{JOB}}}, rank)"),
    }
    return [query_variable(n, *queries[n]) for n in names]


def _link(title: str, uid: str, tooltip: str, kept: tuple[str, ...]) -> Json:
    """A link to another fsdpmon dashboard keeping the time range and the variables this
    dashboard has (a `${x:queryparam}` of a variable it lacks would be sent literally)."""
    params = "".join(f"&${{{v}:queryparam}}" for v in kept if v in ("namespace", "job"))
    return {"title": title, "type": "link", "url": f"/d/{uid}?${{__url_time_range}}{params}",
            "tooltip": tooltip, "targetBlank": False, "keepTime": True, "includeVars": True,
            "asDropdown": False, "icon": "dashboard", "tags": []}


def links(*kept: str) -> list[Json]:
    """Links to the four dashboards, carrying the variables ``kept`` that this dashboard has."""
    return [
        _link("Job overview", "fsdpmon-job", "Throughput, progress, quality and health", kept),
        _link("Ranks", "fsdpmon-ranks", "Per-rank step times, stragglers and memory", kept),
        _link("Nodes and GPUs", "fsdpmon-nodes", "GPU, host and process figures per node", kept),
        _link("Runs compared", "fsdpmon-runs", "Runs of different sizes side by side", kept),
    ]
