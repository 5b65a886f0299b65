"""The four fsdpmon Grafana dashboards, built from the metric catalog and the recording rules.

``all_dashboards()`` maps a file name to its Grafana JSON; ``python -m fsdpmon.dashboards`` writes
them to ``dashboards/generated/``. Each dashboard is built in a module of its own (``jobs``: job
overview and runs compared; ``ranks``; ``nodes``) on what they share (``scope``: variables,
selectors, links).
"""

from __future__ import annotations

from typing import Any

from fsdpmon import catalog
from fsdpmon.dashboards.jobs import job_overview, runs
from fsdpmon.dashboards.nodes import nodes
from fsdpmon.dashboards.ranks import ranks

# Catalogued metrics a rank exposes only when it runs on a CUDA device (MFU needs a known GPU's
# peak FLOP/s). Panels made only of these stay empty for CPU runs; the end-to-end test on a CPU
# run checks that these, and only these, have no data.
DEVICE_ONLY = frozenset({
    catalog.TRAIN_MFU_RATIO.name, catalog.TRAIN_DEVICE_PEAK_FLOPS.name,
    catalog.TRAIN_MEMORY_ALLOCATED_BYTES.name, catalog.TRAIN_MEMORY_RESERVED_BYTES.name,
    catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name, catalog.TRAIN_MEMORY_PEAK_RESERVED_BYTES.name,
    catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name, catalog.TRAIN_ALLOC_RETRIES_TOTAL.name,
    catalog.TRAIN_OOMS_TOTAL.name, catalog.REC_JOB_MFU_RATIO_AVG.name,
})


def all_dashboards() -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON, for every dashboard fsdpmon ships."""
    return {
        "fsdpmon-job-overview.json": job_overview(),
        "fsdpmon-ranks.json": ranks(),
        "fsdpmon-nodes.json": nodes(),
        "fsdpmon-runs.json": runs(),
    }
