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

JOB = 'namespace=~"$namespace", job_name=~"$job"'
RANK = f'{JOB}, rank=~"$rank"'
NODE = 'node=~"$node"'
RATE = "$__rate_interval"
RANGE = "$__range"

# Catalogued metrics a rank exposes only when it runs on a CUDA device (MFU needs a known GPU's
# peak FLOP/s). Panels made only of these stay empty for CPU runs; the end-to-end test on a CPU
# run checks that these, and only these, have no data.
DEVICE_ONLY = frozenset({
    "fsdpmon_train_mfu_ratio", "fsdpmon_train_device_peak_flops",
    "fsdpmon_train_memory_allocated_bytes", "fsdpmon_train_memory_reserved_bytes",
    "fsdpmon_train_memory_peak_active_bytes", "fsdpmon_train_memory_peak_reserved_bytes",
    "fsdpmon_train_device_memory_capacity_bytes", "fsdpmon_train_alloc_retries_total",
    "fsdpmon_train_ooms_total", "fsdpmon_job:mfu_ratio:avg",
})


def _vars(*names: str) -> list[Json]:
    info = m("fsdpmon_train_info")
    queries = {
        "namespace": ("Namespace", f"label_values({info}, namespace)"),
        "job": ("Job", f'label_values({info}{{namespace=~"$namespace"}}, job_name)'),
        "node": ("Node", f"label_values({m('fsdpmon_gpu_utilization_ratio')}, node)"),
        "rank": ("Rank", f"label_values({info}{{{JOB}}}, rank)"),
    }
    return [query_variable(n, *queries[n]) for n in names]


def _link(title: str, uid: str) -> Json:
    return {"title": title, "type": "link", "url": f"/d/{uid}?${{__url_time_range}}"
            "&${namespace:queryparam}&${job:queryparam}", "targetBlank": False,
            "keepTime": True, "includeVars": True, "asDropdown": False, "icon": "dashboard",
            "tags": []}


LINKS = [
    _link("Job overview", "fsdpmon-job"), _link("Ranks", "fsdpmon-ranks"),
    _link("Nodes and GPUs", "fsdpmon-nodes"), _link("Runs compared", "fsdpmon-runs"),
]


def _peak_memory(sel: str) -> str:
    """Peak device memory per rank, process RSS where a rank has no device (CPU runs)."""
    return (f"{m('fsdpmon_train_memory_peak_active_bytes', sel)}"
            f" or {m('fsdpmon_train_process_rss_bytes', sel)}")


PER_JOB = "{{namespace}} {{job_name}}"
PER_RANK = "rank {{rank}}"


def _job(recorded: str, legend: str = PER_JOB) -> Target:
    """A job-level recorded figure for the selected jobs."""
    return Target(f"{recorded}{{{JOB}}}", legend)


def _job_max(name: str) -> Target:
    return Target(f"max by ({JOB_KEYS}) ({m(name, JOB)})", PER_JOB)


def _job_now() -> list[Panel | Row]:
    stalled = m("fsdpmon_train_stalled", JOB)
    return [
        Row("Now"),
        stat("Tokens/s", _job("fsdpmon_job:tokens_per_second:sum")),
        stat("Tokens/s per GPU", _job("fsdpmon_job:tokens_per_second_per_rank:avg")),
        stat("MFU", _job("fsdpmon_job:mfu_ratio:avg"), unit="percentunit",
             description="Model FLOPs utilisation, mean over ranks; absent on unknown devices."),
        stat("Progress", Target(f"fsdpmon_job:step:max{{{JOB}}}"
                                f" / fsdpmon_job:total_steps:max{{{JOB}}}", PER_JOB),
             unit="percentunit"),
        stat("ETA", _job("fsdpmon_job:eta_seconds:estimate"), unit="s",
             description="Remaining steps over the step rate of the last 5 minutes."),
        stat("Stalled ranks", Target(f"sum by ({JOB_KEYS}) ({stalled})", PER_JOB),
             thresholds=((None, "green"), (1, "red")),
             description="Ranks whose heartbeat is older than the monitor's stall threshold."),
    ]


def _job_speed() -> list[Panel | Row]:
    steps = m("fsdpmon_train_steps_total", JOB)
    return [
        Row("Throughput and speed"),
        timeseries("Tokens/s (job)", _job("fsdpmon_job:tokens_per_second:sum")),
        timeseries("Tokens/s per GPU", _job("fsdpmon_job:tokens_per_second_per_rank:avg")),
        timeseries("Step time (median and slowest rank)",
                   _job("fsdpmon_job:step_time_seconds:p50", "median {{job_name}}"),
                   _job("fsdpmon_job:step_time_seconds:max", "max {{job_name}}"), unit="s"),
        timeseries("MFU", _job("fsdpmon_job:mfu_ratio:avg"), unit="percentunit", min=0),
        timeseries("Heartbeat age (oldest rank)", _job("fsdpmon_job:heartbeat_age_seconds:max"),
                   unit="s", description="Seconds since the slowest rank completed a step."),
        timeseries("Data-wait share (worst rank)", _job("fsdpmon_job:data_wait_ratio:max"),
                   unit="percentunit", min=0, max=1,
                   description="Share of step time the most data-starved rank waits for input."),
        timeseries("Steps per second",
                   Target(f"max by ({JOB_KEYS}) (rate({steps}[{RATE}]))", PER_JOB), width=24),
    ]


def _job_quality_and_health() -> list[Panel | Row]:
    return [
        Row("Training quality"),
        timeseries("Loss (mean and max over ranks)",
                   _job("fsdpmon_job:loss:avg", "mean {{job_name}}"),
                   _job("fsdpmon_job:loss:max", "max {{job_name}}")),
        timeseries("Learning rate", _job_max("fsdpmon_train_learning_rate")),
        timeseries("Gradient norm", _job_max("fsdpmon_train_grad_norm")),
        Row("Health"),
        timeseries("Restarts", _job_max("fsdpmon_train_restarts"),
                   description="Elastic restarts of the job (TORCHELASTIC_RESTART_COUNT)."),
        timeseries("Ranks reporting", _job("fsdpmon_job:ranks:count")),
        table("Firing alerts", Target(f'ALERTS{{alertstate="firing", {JOB}}}'), width=8,
              description="fsdpmon alerts firing for the selected jobs."),
    ]


def job_overview() -> Json:
    items = [*_job_now(), *_job_speed(), *_job_quality_and_health()]
    return dashboard("fsdpmon-job", "fsdpmon / Job overview",
                     "Throughput, speed, progress, quality and health of FSDP training jobs.",
                     items, _vars("namespace", "job"), LINKS)


def _rank_step_times() -> list[Panel | Row]:
    step = m("fsdpmon_train_step_time_seconds", RANK)
    hist = bucket("fsdpmon_train_step_duration_seconds", RANK)

    def quantile(q: float) -> Target:
        return Target(f"histogram_quantile({q:g}, sum by ({RANK_KEYS}, le) "
                      f"(rate({hist}[{RATE}])))", f"p{q * 100:g} {PER_RANK}")

    return [
        Row("Step time per rank"),
        heatmap("Step time per rank", Target(step, PER_RANK), unit="s"),
        timeseries("Step time per rank", Target(step, PER_RANK), unit="s", width=12),
        timeseries("Step time spread (rank 0's view of the job)",
                   *(Target(m(f"fsdpmon_job_step_time_{k}_seconds", JOB), f"{k} {{{{job_name}}}}")
                     for k in ("min", "median", "max")), unit="s", width=12),
        timeseries("Step duration p50 / p99 per rank", quantile(0.5), quantile(0.99), unit="s",
                   width=12),
    ]


def _rank_stragglers() -> list[Panel | Row]:
    return [
        Row("Stragglers"),
        timeseries("Slowest rank and highest-memory rank",
                   Target(m("fsdpmon_job_slowest_rank", JOB), "slowest {{job_name}}"),
                   Target(m("fsdpmon_job_peak_memory_max_rank", JOB), "most memory {{job_name}}"),
                   description="Slowest: the rank with the most busy time (step time minus "
                               "collective wait), as rank 0 computes it.", width=6),
        timeseries("Data-wait share per rank",
                   Target(m("fsdpmon_train_data_wait_ratio", RANK), PER_RANK),
                   unit="percentunit", width=9),
        timeseries("Time per step by phase",
                   Target(f"avg by (phase) ({m('fsdpmon_train_phase_duration_seconds', RANK)})",
                          "{{phase}}"), unit="s", stack=True, width=9),
        timeseries("Heartbeat age per rank",
                   Target(m("fsdpmon_train_heartbeat_age_seconds", RANK), PER_RANK),
                   Target(m("fsdpmon_train_stall_threshold_seconds", RANK),
                          "stall threshold " + PER_RANK), unit="s", width=12),
        timeseries("Tokens/s per rank",
                   Target(m("fsdpmon_train_tokens_per_second", RANK), PER_RANK), width=12),
    ]


def _rank_memory() -> list[Panel | Row]:
    return [
        Row("Memory"),
        timeseries("Peak memory per rank", Target(_peak_memory(RANK), PER_RANK), unit="bytes",
                   description="Peak active device memory in the log window (process RSS for "
                               "ranks without a GPU).", width=8),
        timeseries("Highest peak memory over ranks",
                   Target(m("fsdpmon_job_peak_memory_max_bytes", JOB), "{{job_name}}"),
                   unit="bytes", width=8),
        timeseries("Allocator retries and OOMs",
                   Target(f"increase({m('fsdpmon_train_alloc_retries_total', RANK)}[{RATE}])",
                          "retries " + PER_RANK),
                   Target(f"increase({m('fsdpmon_train_ooms_total', RANK)}[{RATE}])",
                          "OOMs " + PER_RANK), width=8),
        table("Ranks now",
              *(Target(m(name, RANK)) for name in (
                  "fsdpmon_train_step_time_seconds", "fsdpmon_train_data_wait_ratio",
                  "fsdpmon_train_tokens_per_second", "fsdpmon_train_heartbeat_age_seconds",
                  "fsdpmon_train_step")), height=10),
    ]


def ranks() -> Json:
    items = [*_rank_step_times(), *_rank_stragglers(), *_rank_memory()]
    return dashboard("fsdpmon-ranks", "fsdpmon / Ranks and stragglers",
                     "Per-rank step time, phases, data wait and memory: find the slow rank.",
                     items, _vars("namespace", "job", "rank"), LINKS)


def _gpu(name: str, legend_extra: str = "") -> Target:
    return Target(m(name, NODE), "{{node}} GPU {{gpu}}" + legend_extra)


def _gpu_use() -> list[Panel | Row]:
    return [
        Row("Utilisation"),
        timeseries("GPU utilisation", _gpu("fsdpmon_gpu_utilization_ratio"),
                   unit="percentunit", min=0, max=1),
        timeseries("SM and tensor-core activity", _gpu("fsdpmon_gpu_sm_activity_ratio", " SM"),
                   _gpu("fsdpmon_gpu_tensor_activity_ratio", " tensor"),
                   unit="percentunit", min=0, max=1),
        timeseries("Average GPU utilisation per node",
                   Target(f"fsdpmon_node:gpu_utilization_ratio:avg{{{NODE}}}", "{{node}}"),
                   unit="percentunit", min=0, max=1),
        Row("Memory"),
        timeseries("GPU memory used", _gpu("fsdpmon_gpu_memory_used_bytes"), unit="bytes"),
        timeseries("GPU memory used share",
                   Target(f"fsdpmon_gpu:memory_used_bytes:ratio{{{NODE}}}", "{{node}} GPU {{gpu}}"),
                   unit="percentunit", min=0, max=1),
        timeseries("GPU memory used per node",
                   Target(f"fsdpmon_node:gpu_memory_used_bytes:sum{{{NODE}}}", "{{node}}"),
                   unit="bytes"),
        timeseries("GPU memory per pod",
                   Target(f"fsdpmon_pod:gpu_memory_used_bytes:sum{{{NODE}}}",
                          "{{node}} {{namespace}}/{{pod}}"), unit="bytes", width=24,
                   description="Device memory of each pod's processes (empty pod: processes "
                               "outside Kubernetes pods)."),
    ]


def _gpu_physics() -> list[Panel | Row]:
    return [
        Row("Thermals, power and clocks"),
        timeseries("Temperature", _gpu("fsdpmon_gpu_temperature_celsius"),
                   _gpu("fsdpmon_gpu_memory_temperature_celsius", " HBM"), unit="celsius"),
        timeseries("Power", _gpu("fsdpmon_gpu_power_watts"),
                   _gpu("fsdpmon_gpu_power_limit_watts", " limit"), unit="watt"),
        timeseries("GPU power per node",
                   Target(f"fsdpmon_node:gpu_power_watts:sum{{{NODE}}}", "{{node}}"),
                   unit="watt"),
        timeseries("Energy per GPU", Target(
            f"rate({m('fsdpmon_gpu_energy_joules_total', NODE)}[{RATE}])",
            "{{node}} GPU {{gpu}}"), unit="watt",
            description="Average power from the energy counter."),
        timeseries("Clocks", _gpu("fsdpmon_gpu_sm_clock_hertz", " SM"),
                   _gpu("fsdpmon_gpu_memory_clock_hertz", " memory"), unit="hertz"),
        timeseries("Throttled GPUs by reason",
                   Target(f"sum by (node, reason) "
                          f"({m('fsdpmon_gpu_clock_event_active', NODE)})", "{{node}} {{reason}}"),
                   description="GPUs with each clock-event (throttle) reason active."),
    ]


def _gpu_errors_and_links() -> list[Panel | Row]:
    # Every GPU gets a 0 line while it has no XID: the exporter serves XID series only once
    # one occurred, and "no data" would read as "not monitored".
    every_gpu = f"0 * {m('fsdpmon_gpu_utilization_ratio', NODE)}"
    xid = (f"sum by (node, gpu, xid) "
           f"(increase({m('fsdpmon_gpu_xid_errors_total', NODE)}[{RATE}]))"
           f"\nor on (node, gpu) sum by (node, gpu) (fsdpmon_gpu:dcgm_xid_errors:changes{{{NODE}}})"
           f"\nor on (node, gpu) sum by (node, gpu) ({every_gpu})")
    return [
        Row("Errors and interconnect"),
        timeseries("XID errors", Target(xid, "{{node}} GPU {{gpu}} XID {{xid}}"),
                   description="XID errors per scrape interval; 0 while none occurred."),
        timeseries("ECC errors and remapped rows",
                   Target(f"sum by (node, gpu, type) "
                          f"(increase({m('fsdpmon_gpu_ecc_errors_total', NODE)}[{RATE}]))",
                          "{{node}} GPU {{gpu}} ECC {{type}}"),
                   _gpu("fsdpmon_gpu_remapped_rows", " rows {{cause}}")),
        timeseries("PCIe replays", Target(
            f"increase({m('fsdpmon_gpu_pcie_replay_errors_total', NODE)}[{RATE}])",
            "{{node}} GPU {{gpu}}")),
        timeseries("PCIe traffic", _gpu("fsdpmon_gpu_pcie_bytes_per_second", " {{direction}}"),
                   unit="Bps", width=12),
        timeseries("NVLink traffic",
                   _gpu("fsdpmon_gpu_nvlink_bytes_per_second", " {{direction}}"),
                   unit="Bps", width=12),
    ]


def _host() -> list[Panel | Row]:
    return [
        Row("Host and processes"),
        timeseries("Host CPU", Target(m("fsdpmon_host_cpu_utilization_ratio",
                                        f'{NODE}, cpu="all"'), "{{node}}"),
                   unit="percentunit", min=0, max=1),
        timeseries("Host memory", Target(m("fsdpmon_host_memory_used_bytes", NODE), "{{node}}"),
                   unit="bytes"),
        timeseries("Exporter sample time",
                   Target(m("fsdpmon_exporter_sample_duration_seconds", NODE),
                          "{{node}} {{source}}"), unit="s"),
        table("Busiest processes",
              Target(f"topk(20, {m('fsdpmon_process_cpu_utilization_ratio', NODE)})"),
              Target(m("fsdpmon_process_resident_memory_bytes", NODE))),
    ]


def nodes() -> Json:
    items = [*_gpu_use(), *_gpu_physics(), *_gpu_errors_and_links(), *_host()]
    return dashboard("fsdpmon-nodes", "fsdpmon / Nodes and GPUs",
                     "GPU utilisation, memory, thermals, power, clocks, errors and interconnect, "
                     "host and processes, per node.", items, _vars("namespace", "node"), LINKS)


def _by_world_size(expr: str) -> str:
    """Attach each job's ``world_size`` (from its info series over the range) to ``expr``."""
    info = f"max_over_time({m('fsdpmon_train_info', JOB)}[{RANGE}])"
    return (f"max by ({JOB_KEYS}, world_size) (\n  {expr}\n  * on ({JOB_KEYS}) group_left "
            f"(world_size)\n  max by ({JOB_KEYS}, world_size) ({info})\n)")


def _median_over_range(recorded: str) -> str:
    """Steady state of a job figure over the dashboard's range (robust to warm-up and stalls)."""
    return f"quantile_over_time(0.5, {recorded}{{{JOB}}}[{RANGE}])"


def _peak_over_range(recorded: str) -> str:
    return f"max_over_time({recorded}{{{JOB}}}[{RANGE}])"


def runs() -> Json:
    legend = "{{job_name}} · {{world_size}} ranks"
    per_gpu = _by_world_size(_median_over_range("fsdpmon_job:tokens_per_second_per_rank:avg"))
    total = _by_world_size(_median_over_range("fsdpmon_job:tokens_per_second:sum"))
    memory = _by_world_size(_peak_over_range("fsdpmon_job:peak_memory_bytes:max"))
    step = _by_world_size(_median_over_range("fsdpmon_job:step_time_seconds:p50"))
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
                   Target(f"fsdpmon_job:tokens_per_second_per_rank:avg{{{JOB}}}", "{{job_name}}"),
                   width=12),
        timeseries("Peak memory per GPU",
                   Target(f"fsdpmon_job:peak_memory_bytes:max{{{JOB}}}", "{{job_name}}"),
                   unit="bytes", width=12),
    ]
    return dashboard("fsdpmon-runs", "fsdpmon / Runs compared",
                     "Throughput and memory per GPU against world size across jobs: the scaling "
                     "chart of the EKS workflow, live.", items, _vars("namespace", "job"), LINKS)


def all_dashboards() -> dict[str, dict[str, Any]]:
    """File name -> Grafana dashboard JSON, for every dashboard fsdpmon ships."""
    return {
        "fsdpmon-job-overview.json": job_overview(),
        "fsdpmon-ranks.json": ranks(),
        "fsdpmon-nodes.json": nodes(),
        "fsdpmon-runs.json": runs(),
    }
