"""The nodes dashboard: per node, GPU utilisation, memory, thermals, power, clocks, errors and
interconnect, then the host and its processes.
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.catalog import Metric
from fsdpmon.dashboards.panels import (
    Json,
    Panel,
    Row,
    Target,
    dashboard,
    table,
    timeseries,
)
from fsdpmon.dashboards.promql import m
from fsdpmon.dashboards.scope import NODE, RATE, links, variables


def _gpu(metric: Metric, legend_extra: str = "") -> Target:
    return Target(m(metric, NODE), "{{node}} GPU {{gpu}}" + legend_extra)


def _gpu_use() -> list[Panel | Row]:
    return [
        Row("Utilisation"),
        timeseries("GPU utilisation", _gpu(catalog.GPU_UTILIZATION_RATIO),
                   unit="percentunit", min=0, max=1),
        timeseries("SM and tensor-core activity", _gpu(catalog.GPU_SM_ACTIVITY_RATIO, " SM"),
                   _gpu(catalog.GPU_TENSOR_ACTIVITY_RATIO, " tensor"),
                   unit="percentunit", min=0, max=1),
        timeseries("Average GPU utilisation per node",
                   Target(m(catalog.REC_NODE_GPU_UTILIZATION_RATIO_AVG, NODE), "{{node}}"),
                   unit="percentunit", min=0, max=1),
        Row("Memory"),
        timeseries("GPU memory used", _gpu(catalog.GPU_MEMORY_USED_BYTES), unit="bytes"),
        timeseries("GPU memory used share",
                   Target(m(catalog.REC_GPU_MEMORY_USED_BYTES_RATIO, NODE), "{{node}} GPU {{gpu}}"),
                   unit="percentunit", min=0, max=1),
        timeseries("GPU memory used per node",
                   Target(m(catalog.REC_NODE_GPU_MEMORY_USED_BYTES_SUM, NODE), "{{node}}"),
                   unit="bytes"),
        timeseries("GPU memory per pod",
                   Target(m(catalog.REC_POD_GPU_MEMORY_USED_BYTES_SUM, NODE),
                          "{{node}} {{namespace}}/{{pod}}"), unit="bytes", width=24,
                   description="Device memory of each pod's processes (empty pod: processes "
                               "outside Kubernetes pods)."),
    ]


def _gpu_physics() -> list[Panel | Row]:
    return [
        Row("Thermals, power and clocks"),
        timeseries("Temperature", _gpu(catalog.GPU_TEMPERATURE_CELSIUS),
                   _gpu(catalog.GPU_MEMORY_TEMPERATURE_CELSIUS, " HBM"), unit="celsius"),
        timeseries("Power", _gpu(catalog.GPU_POWER_WATTS),
                   _gpu(catalog.GPU_POWER_LIMIT_WATTS, " limit"), unit="watt"),
        timeseries("GPU power per node",
                   Target(m(catalog.REC_NODE_GPU_POWER_WATTS_SUM, NODE), "{{node}}"),
                   unit="watt"),
        timeseries("Energy per GPU", Target(
            f"rate({m(catalog.GPU_ENERGY_JOULES_TOTAL, NODE)}[{RATE}])",
            "{{node}} GPU {{gpu}}"), unit="watt",
            description="Average power from the energy counter."),
        timeseries("Clocks", _gpu(catalog.GPU_SM_CLOCK_HERTZ, " SM"),
                   _gpu(catalog.GPU_MEMORY_CLOCK_HERTZ, " memory"), unit="hertz"),
        timeseries("Throttled GPUs by reason",
                   Target(f"sum by (node, reason) "
                          f"({m(catalog.GPU_CLOCK_EVENT_ACTIVE, NODE)})", "{{node}} {{reason}}"),
                   description="GPUs with each clock-event (throttle) reason active."),
        timeseries("Share of time throttled", Target(
            f"rate({m(catalog.GPU_CLOCK_EVENT_SECONDS_TOTAL, NODE)}[{RATE}])",
            "{{node}} GPU {{gpu}} {{reason}}"), unit="percentunit", min=0, max=1,
            description="Share of time each reason held the clocks down, from NVML's "
                        "accumulated clock-event time: throttling that comes and goes between "
                        "scrapes shows here, not in the active flags."),
    ]


def _gpu_errors_and_links() -> list[Panel | Row]:
    # Every GPU gets a 0 line while it has no XID: the exporter serves XID series only once
    # one occurred, and "no data" would read as "not monitored".
    every_gpu = f"0 * {m(catalog.GPU_UTILIZATION_RATIO, NODE)}"
    dcgm_xid = m(catalog.REC_GPU_DCGM_XID_ERRORS_CHANGES, NODE)
    xid = (f"sum by (node, gpu, xid) "
           f"(increase({m(catalog.GPU_XID_ERRORS_TOTAL, NODE)}[{RATE}]))"
           f"\nor on (node, gpu) sum by (node, gpu) ({dcgm_xid})"
           f"\nor on (node, gpu) sum by (node, gpu) ({every_gpu})")
    return [
        Row("Errors and interconnect"),
        timeseries("XID errors", Target(xid, "{{node}} GPU {{gpu}} XID {{xid}}"),
                   description="XID errors per scrape interval; 0 while none occurred."),
        timeseries("ECC errors and remapped rows",
                   Target(f"sum by (node, gpu, type) "
                          f"(increase({m(catalog.GPU_ECC_ERRORS_TOTAL, NODE)}[{RATE}]))",
                          "{{node}} GPU {{gpu}} ECC {{type}}"),
                   _gpu(catalog.GPU_REMAPPED_ROWS, " rows {{cause}}")),
        timeseries("PCIe replays", Target(
            f"increase({m(catalog.GPU_PCIE_REPLAY_ERRORS_TOTAL, NODE)}[{RATE}])",
            "{{node}} GPU {{gpu}}")),
        timeseries("PCIe traffic", _gpu(catalog.GPU_PCIE_BYTES_PER_SECOND, " {{direction}}"),
                   unit="Bps", width=12),
        timeseries("NVLink traffic",
                   _gpu(catalog.GPU_NVLINK_BYTES_PER_SECOND, " {{direction}}"),
                   unit="Bps", width=12),
    ]


def _host() -> list[Panel | Row]:
    return [
        Row("Host and processes"),
        timeseries("Host CPU", Target(m(catalog.HOST_CPU_UTILIZATION_RATIO,
                                        f'{NODE}, cpu="all"'), "{{node}}"),
                   unit="percentunit", min=0, max=1),
        timeseries("Host memory", Target(m(catalog.HOST_MEMORY_USED_BYTES, NODE), "{{node}}"),
                   unit="bytes"),
        timeseries("Exporter sample time",
                   Target(m(catalog.EXPORTER_SAMPLE_DURATION_SECONDS, NODE),
                          "{{node}} {{source}}"), unit="s"),
        table("Busiest processes",
              Target(f"topk(20, {m(catalog.PROCESS_CPU_UTILIZATION_RATIO, NODE)})"),
              Target(m(catalog.PROCESS_RESIDENT_MEMORY_BYTES, NODE))),
    ]


def nodes() -> Json:
    items = [*_gpu_use(), *_gpu_physics(), *_gpu_errors_and_links(), *_host()]
    return dashboard("fsdpmon-nodes", "fsdpmon / Nodes and GPUs",
                     "GPU utilisation, memory, thermals, power, clocks, errors and interconnect, "
                     "host and processes, per node.", items, variables("node"),
                     links("node"))
