"""The four fsdpmon Grafana dashboards, built from the metric catalog and the recording rules.

``all_dashboards()`` maps a file name to its Grafana JSON; ``python -m dashboards`` writes them to
``dashboards/generated/``. Queries name catalogued metrics through :func:`dashboards.promql.m`
and job-level figures through the recorded names of :mod:`dashboards.rules`.

Variables: ``datasource``, ``namespace``, ``job`` (the ``job_name`` label), ``node`` and ``rank``.
Every filter is a regex match with "All" = ``.*``, which also matches a missing label, so the
same dashboards work for Kubernetes scrapes (with ``namespace``) and local runs (without).
"""

from __future__ import annotations

from typing import Any

from dashboards.panels import (
    Json,
    Panel,
    Row,
    Target,
    bars,
    dashboard,
    heatmap,
    query_variable,
    stat,
    table,
    timeseries,
)
from dashboards.promql import JOB_KEYS, RANK_KEYS, bucket, m
from fsdpmon import catalog
from fsdpmon.catalog import Metric, Recorded
from fsdpmon.conventions import GPU_THROTTLE_REASONS, STRAGGLER_SCORE_THRESHOLD

JOB = 'namespace=~"$namespace", job_name=~"$job"'
RANK = f'{JOB}, rank=~"$rank"'
NODE = 'node=~"$node"'
NODE_ALL = 'node=~".+"'  # dashboards without a node variable
RATE = "$__rate_interval"
RANGE = "$__range"

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


def _vars(*names: str) -> list[Json]:
    info = m(catalog.TRAIN_INFO)
    queries = {
        "namespace": ("Namespace", f"label_values({info}, namespace)"),
        "job": ("Job", f'label_values({info}{{namespace=~"$namespace"}}, job_name)'),
        "node": ("Node", f"label_values({m(catalog.GPU_UTILIZATION_RATIO)}, node)"),
        "rank": ("Rank", f"label_values({info}{{{JOB}}}, rank)"),
    }
    return [query_variable(n, *queries[n]) for n in names]


def _link(title: str, uid: str, tooltip: str, variables: tuple[str, ...]) -> Json:
    """A link to another fsdpmon dashboard keeping the time range and the variables this
    dashboard has (a `${x:queryparam}` of a variable it lacks would be sent literally)."""
    params = "".join(f"&${{{v}:queryparam}}" for v in variables if v in ("namespace", "job"))
    return {"title": title, "type": "link", "url": f"/d/{uid}?${{__url_time_range}}{params}",
            "tooltip": tooltip, "targetBlank": False, "keepTime": True, "includeVars": True,
            "asDropdown": False, "icon": "dashboard", "tags": []}


def _links(*variables: str) -> list[Json]:
    return [
        _link("Job overview", "fsdpmon-job", "Throughput, progress, quality and health",
              variables),
        _link("Ranks", "fsdpmon-ranks", "Per-rank step times, stragglers and memory", variables),
        _link("Nodes and GPUs", "fsdpmon-nodes", "GPU, host and process figures per node",
              variables),
        _link("Runs compared", "fsdpmon-runs", "Runs of different sizes side by side",
              variables),
    ]


def _peak_memory(sel: str) -> str:
    """Peak device memory per rank, process RSS where a rank has no device (CPU runs)."""
    return (f"{m(catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES, sel)}"
            f" or {m(catalog.TRAIN_PROCESS_RSS_BYTES, sel)}")


PER_JOB = "{{namespace}} {{job_name}}"
PER_RANK = "rank {{rank}}"


def _job(recorded: Recorded, legend: str = PER_JOB) -> Target:
    """A job-level recorded figure for the selected jobs."""
    return Target(m(recorded, JOB), legend)


def _job_max(metric: Metric) -> Target:
    return Target(f"max by ({JOB_KEYS}) ({m(metric, JOB)})", PER_JOB)


def _job_now() -> list[Panel | Row]:
    stalled = m(catalog.TRAIN_STALLED, JOB)
    return [
        Row("Now"),
        stat("Tokens/s", _job(catalog.REC_JOB_TOKENS_PER_SECOND_SUM)),
        stat("Tokens/s per GPU", _job(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG)),
        stat("MFU", _job(catalog.REC_JOB_MFU_RATIO_AVG), unit="percentunit",
             description="Model FLOPs utilisation, mean over ranks; absent on unknown devices."),
        stat("Progress", Target(f"{m(catalog.REC_JOB_STEP_MAX, JOB)}"
                                f" / {m(catalog.REC_JOB_TOTAL_STEPS_MAX, JOB)}", PER_JOB),
             unit="percentunit"),
        stat("ETA", _job(catalog.REC_JOB_ETA_SECONDS_ESTIMATE), unit="s",
             description="Remaining steps over the step rate of the last 5 minutes."),
        stat("Stalled ranks", Target(f"sum by ({JOB_KEYS}) ({stalled})", PER_JOB),
             thresholds=((None, "green"), (1, "red")),
             description="Ranks whose heartbeat is older than the monitor's stall threshold."),
    ]


def _job_speed() -> list[Panel | Row]:
    steps = m(catalog.TRAIN_STEPS_TOTAL, JOB)
    return [
        Row("Throughput and speed"),
        timeseries("Tokens/s (job)", _job(catalog.REC_JOB_TOKENS_PER_SECOND_SUM)),
        timeseries("Tokens/s per GPU", _job(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG)),
        timeseries("Step time (median and slowest rank)",
                   _job(catalog.REC_JOB_STEP_TIME_SECONDS_P50, "median {{job_name}}"),
                   _job(catalog.REC_JOB_STEP_TIME_SECONDS_MAX, "max {{job_name}}"), unit="s"),
        timeseries("MFU", _job(catalog.REC_JOB_MFU_RATIO_AVG), unit="percentunit", min=0),
        timeseries("Heartbeat age (oldest rank)", _job(catalog.REC_JOB_HEARTBEAT_AGE_SECONDS_MAX),
                   unit="s", description="Seconds since the slowest rank completed a step."),
        timeseries("Data-wait share (worst rank)", _job(catalog.REC_JOB_DATA_WAIT_RATIO_MAX),
                   unit="percentunit", min=0, max=1,
                   description="Share of step time the most data-starved rank waits for input."),
        timeseries("Steps per second",
                   Target(f"max by ({JOB_KEYS}) (rate({steps}[{RATE}]))", PER_JOB), width=24),
    ]


def _throttled_gpus() -> Target:
    """Per GPU and each rank whose worker process runs on it, the slowdown clock events active
    now (0: full clocks). The exporter reads the worker's RANK; top and `fsdpmon diagnose` tie
    them the same way. A GPU may serve several ranks (two jobs, a restarted pod), so the reasons
    are counted per GPU first: PromQL cannot join many reasons to many ranks."""
    reasons = "|".join(GPU_THROTTLE_REASONS)
    events = m(catalog.GPU_CLOCK_EVENT_ACTIVE, f'{NODE_ALL}, reason=~"{reasons}"')
    workers = m(catalog.PROCESS_INFO, 'namespace=~"$namespace", rank!=""')
    held = (f"{m(catalog.GPU_PROCESS_MEMORY_USED_BYTES)} * 0 + on (node, pid) group_left (rank)"
            f" {workers}")
    return Target(f"max by (node, gpu, rank) ({held})\n* on (node, gpu) group_left\n"
                  f"sum by (node, gpu) ({events})")


def _job_diagnosis() -> list[Panel | Row]:
    score = m(catalog.TRAIN_STRAGGLER_SCORE, JOB)
    busy = m(catalog.TRAIN_BUSY_SECONDS, JOB)
    # Seconds per step waiting in collectives: the window's wait share of its mean step time.
    waiting = (f"{m(catalog.TRAIN_COLLECTIVE_WAIT_RATIO, JOB)}"
               f" * {m(catalog.TRAIN_STEP_TIME_SECONDS, JOB)}")
    return [
        Row("Diagnosis"),
        timeseries("Straggler score per rank", Target(score, PER_RANK), min=0,
                   thresholds=((None, "red"), (STRAGGLER_SCORE_THRESHOLD, "green")),
                   threshold_lines=True, width=12,
                   description="Median busy time of the other ranks over this rank's own (busy: "
                               "step time not spent waiting in collectives, median over the "
                               "recent steps). About 1 on a healthy job; below the dashed line "
                               f"({STRAGGLER_SCORE_THRESHOLD:g}) the rank is a straggler and "
                               "FsdpmonRankStraggling fires (cause straggler_compute)."),
        timeseries("Busy vs collective wait per rank", Target(busy, "busy " + PER_RANK),
                   Target(waiting, "waiting " + PER_RANK), unit="s", min=0, width=12,
                   description="Per rank, seconds per step busy (median over the recent steps) "
                               "and waiting in collectives (last log window). In synchronous "
                               "training the straggler is the rank that waits least and is "
                               "busy longest; every other rank waits for it at each "
                               "collective."),
        table("Throttled GPUs and the ranks they serve", _throttled_gpus(), width=24,
              thresholds=((None, "green"), (1, "red")),
              description="Each GPU with the rank(s) whose worker process runs on it, and "
                          "how many slowdown clock events (thermal, power brake, hardware "
                          "slowdown) are active on it now; 0 at full clocks. A throttled GPU "
                          "explains its rank's straggling (cause gpu_throttled); the Nodes "
                          "dashboard shows which reason and for how long."),
    ]


def _job_quality_and_health() -> list[Panel | Row]:
    return [
        Row("Training quality"),
        timeseries("Loss (mean and max over ranks)",
                   _job(catalog.REC_JOB_LOSS_AVG, "mean {{job_name}}"),
                   _job(catalog.REC_JOB_LOSS_MAX, "max {{job_name}}")),
        timeseries("Learning rate", _job_max(catalog.TRAIN_LEARNING_RATE)),
        timeseries("Gradient norm", _job_max(catalog.TRAIN_GRAD_NORM)),
        Row("Health"),
        timeseries("Restarts", _job_max(catalog.TRAIN_RESTARTS),
                   description="Elastic restarts of the job (TORCHELASTIC_RESTART_COUNT)."),
        timeseries("Ranks reporting", _job(catalog.REC_JOB_RANKS_COUNT)),
        table("Firing alerts", Target(f'ALERTS{{alertstate="firing", {JOB}}}'), width=8,
              description="fsdpmon alerts firing for the selected jobs."),
    ]


def job_overview() -> Json:
    items = [*_job_now(), *_job_speed(), *_job_diagnosis(), *_job_quality_and_health()]
    return dashboard("fsdpmon-job", "fsdpmon / Job overview",
                     "Throughput, speed, progress, quality and health of FSDP training jobs.",
                     items, _vars("namespace", "job"), _links("namespace", "job"))


def _rank_step_times() -> list[Panel | Row]:
    step = m(catalog.TRAIN_STEP_TIME_SECONDS, RANK)
    hist = bucket(catalog.TRAIN_STEP_DURATION_SECONDS, RANK)

    def quantile(q: float) -> Target:
        return Target(f"histogram_quantile({q:g}, sum by ({RANK_KEYS}, le) "
                      f"(rate({hist}[{RATE}])))", f"p{q * 100:g} {PER_RANK}")

    return [
        Row("Step time per rank"),
        heatmap("Step time per rank", Target(step, PER_RANK), unit="s"),
        timeseries("Step time per rank", Target(step, PER_RANK), unit="s", width=12),
        timeseries("Step time spread (rank 0's view of the job)",
                   *(Target(m(metric, JOB), f"{k} {{{{job_name}}}}") for k, metric in (
                       ("min", catalog.JOB_STEP_TIME_MIN_SECONDS),
                       ("median", catalog.JOB_STEP_TIME_MEDIAN_SECONDS),
                       ("max", catalog.JOB_STEP_TIME_MAX_SECONDS))), unit="s", width=12),
        timeseries("Step duration p50 / p99 per rank", quantile(0.5), quantile(0.99), unit="s",
                   width=12),
    ]


def _rank_stragglers() -> list[Panel | Row]:
    return [
        Row("Stragglers"),
        timeseries("Slowest rank and highest-memory rank",
                   Target(m(catalog.JOB_SLOWEST_RANK, JOB), "slowest {{job_name}}"),
                   Target(m(catalog.JOB_PEAK_MEMORY_MAX_RANK, JOB), "most memory {{job_name}}"),
                   description="Slowest: the rank with the most busy time (step time minus "
                               "collective wait), as rank 0 computes it.", width=6),
        timeseries("Data-wait share per rank",
                   Target(m(catalog.TRAIN_DATA_WAIT_RATIO, RANK), PER_RANK),
                   unit="percentunit", width=9),
        timeseries("Time per step by phase",
                   Target(f"avg by (phase) ({m(catalog.TRAIN_PHASE_DURATION_SECONDS, RANK)})",
                          "{{phase}}"), unit="s", stack=True, width=9),
        timeseries("Heartbeat age per rank",
                   Target(m(catalog.TRAIN_HEARTBEAT_AGE_SECONDS, RANK), PER_RANK),
                   Target(m(catalog.TRAIN_STALL_THRESHOLD_SECONDS, RANK),
                          "stall threshold " + PER_RANK), unit="s", width=12),
        timeseries("Tokens/s per rank",
                   Target(m(catalog.TRAIN_TOKENS_PER_SECOND, RANK), PER_RANK), width=12),
    ]


def _rank_memory() -> list[Panel | Row]:
    return [
        Row("Memory"),
        timeseries("Peak memory per rank", Target(_peak_memory(RANK), PER_RANK), unit="bytes",
                   description="Peak active device memory in the log window (process RSS for "
                               "ranks without a GPU).", width=8),
        timeseries("Highest peak memory over ranks",
                   Target(m(catalog.JOB_PEAK_MEMORY_MAX_BYTES, JOB), "{{job_name}}"),
                   unit="bytes", width=8),
        timeseries("Allocator retries and OOMs",
                   Target(f"increase({m(catalog.TRAIN_ALLOC_RETRIES_TOTAL, RANK)}[{RATE}])",
                          "retries " + PER_RANK),
                   Target(f"increase({m(catalog.TRAIN_OOMS_TOTAL, RANK)}[{RATE}])",
                          "OOMs " + PER_RANK), width=8),
        table("Ranks now",
              *(Target(m(metric, RANK)) for metric in (
                  catalog.TRAIN_STEP_TIME_SECONDS, catalog.TRAIN_DATA_WAIT_RATIO,
                  catalog.TRAIN_TOKENS_PER_SECOND, catalog.TRAIN_HEARTBEAT_AGE_SECONDS,
                  catalog.TRAIN_STEP)), height=10),
    ]


def ranks() -> Json:
    items = [*_rank_step_times(), *_rank_stragglers(), *_rank_memory()]
    return dashboard("fsdpmon-ranks", "fsdpmon / Ranks and stragglers",
                     "Per-rank step time, phases, data wait and memory: find the slow rank.",
                     items, _vars("namespace", "job", "rank"),
                     _links("namespace", "job"))


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
                     "host and processes, per node.", items, _vars("node"),
                     _links("node"))


def _by_world_size(expr: str) -> str:
    """Attach each job's ``world_size`` (from its info series over the range) to ``expr``."""
    info = f"max_over_time({m(catalog.TRAIN_INFO, JOB)}[{RANGE}])"
    return (f"max by ({JOB_KEYS}, world_size) (\n  {expr}\n  * on ({JOB_KEYS}) group_left "
            f"(world_size)\n  max by ({JOB_KEYS}, world_size) ({info})\n)")


def _median_over_range(recorded: Recorded) -> str:
    """Steady state of a job figure over the dashboard's range (robust to warm-up and stalls)."""
    return f"quantile_over_time(0.5, {m(recorded, JOB)}[{RANGE}])"


def _peak_over_range(recorded: Recorded) -> str:
    return f"max_over_time({m(recorded, JOB)}[{RANGE}])"


def runs() -> Json:
    legend = "{{job_name}} · {{world_size}} ranks"
    per_gpu = _by_world_size(_median_over_range(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG))
    total = _by_world_size(_median_over_range(catalog.REC_JOB_TOKENS_PER_SECOND_SUM))
    memory = _by_world_size(_peak_over_range(catalog.REC_JOB_PEAK_MEMORY_BYTES_MAX))
    step = _by_world_size(_median_over_range(catalog.REC_JOB_STEP_TIME_SECONDS_P50))
    items: list[Panel | Row] = [
        Row("Scaling across jobs (over the dashboard's time range)"),
        bars("Tokens/s per GPU by world size", Target(per_gpu, legend),
             description="Median over the time range; flat bars mean linear scaling."),
        bars("Peak memory per GPU by world size", Target(memory, legend), unit="bytes",
             description="FSDP shards parameters, gradients and optimiser state: more ranks, "
                         "less memory per GPU."),
        bars("Tokens/s (job) by world size", Target(total, legend)),
        bars("Step time by world size", Target(step, legend), unit="s"),
        table("Runs", Target(per_gpu), Target(total), Target(memory), Target(step),
              description="Per job: tokens/s per GPU, tokens/s, peak memory per GPU, step time."),
        Row("Live"),
        timeseries("Tokens/s per GPU",
                   Target(m(catalog.REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG, JOB), "{{job_name}}"),
                   width=12),
        timeseries("Peak memory per GPU",
                   Target(m(catalog.REC_JOB_PEAK_MEMORY_BYTES_MAX, JOB), "{{job_name}}"),
                   unit="bytes", width=12),
    ]
    return dashboard("fsdpmon-runs", "fsdpmon / Runs compared",
                     "Throughput and memory per GPU against world size across jobs: the scaling "
                     "chart of the EKS workflow, live.", items, _vars("namespace", "job"),
                     _links("namespace", "job"))


def all_dashboards() -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON, for every dashboard fsdpmon ships."""
    return {
        "fsdpmon-job-overview.json": job_overview(),
        "fsdpmon-ranks.json": ranks(),
        "fsdpmon-nodes.json": nodes(),
        "fsdpmon-runs.json": runs(),
    }
