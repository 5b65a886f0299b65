"""The metric catalog: the single source of truth for every metric name, type, unit and label.

The in-trainer monitor, the per-node exporter, the dashboards, the alert rules and `fsdpmon top`
all take names from here; tests fail when a dashboard or rule names a metric this module lacks.

Names follow Prometheus practice: prefix ``fsdpmon_``, base unit in the name, counters end in
``_total``, ``*_info`` gauges carry static labels with value 1. ``Metric.name`` is the name as it
appears in the exposition (counters with their ``_total``; histograms without the ``_bucket`` /
``_sum`` / ``_count`` suffixes).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fsdpmon.conventions import GPU_LABELS, JOB_LABEL, POD_LABELS, TRAINING_LABELS


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    unit: str  # "seconds", "bytes", "ratio", "celsius", "watts", "joules", "hertz", "" ...
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def family(self) -> str:
        """The name prometheus_client's metric families take (counters without ``_total``)."""
        if self.kind is Kind.COUNTER and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    def series_names(self) -> tuple[str, ...]:
        """Every sample name this metric can put in an exposition."""
        if self.kind is Kind.HISTOGRAM:
            return tuple(self.name + s for s in ("_bucket", "_sum", "_count"))
        return (self.name,)


T = TRAINING_LABELS
J = (JOB_LABEL,)
G = GPU_LABELS
GP = GPU_LABELS + POD_LABELS
C, Gg, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

# Step durations from ~10 ms (tiny CPU models) to minutes (70B with accumulation).
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

TRAINING: tuple[Metric, ...] = (
    # Progress
    Metric("fsdpmon_train_info", Gg, "", "Static facts about the run (value 1).",
           (*T, "model", "world_size", "nodes", "dtype", "torch_version", "node", "device")),
    Metric("fsdpmon_train_steps_total", C, "", "Optimiser steps completed by this process.", T),
    Metric("fsdpmon_train_step", Gg, "", "Global step number of the last completed step.", T),
    Metric("fsdpmon_train_total_steps", Gg, "", "Planned number of steps, when known.", T),
    Metric("fsdpmon_train_last_step_timestamp_seconds", Gg, "seconds",
           "Unix time the last step completed: the heartbeat that stall alerts use.", T),
    Metric("fsdpmon_train_tokens_total", C, "", "Tokens processed by this rank.", T),
    Metric("fsdpmon_train_tokens_per_second", Gg, "",
           "Tokens per second on this rank over the last log window.", T),
    Metric("fsdpmon_train_restarts", Gg, "",
           "Times the job was restarted by the elastic agent (TORCHELASTIC_RESTART_COUNT).", T),
    # Speed
    Metric("fsdpmon_train_step_duration_seconds", H, "seconds",
           "Duration of each optimiser step.", T, STEP_BUCKETS),
    Metric("fsdpmon_train_step_time_seconds", Gg, "seconds",
           "Mean step duration over the last log window.", T),
    Metric("fsdpmon_train_phase_seconds_total", C, "seconds",
           "Time spent in each phase of the step (data, forward, backward, optimizer, "
           "checkpoint).", (*T, "phase")),
    Metric("fsdpmon_train_phase_duration_seconds", Gg, "seconds",
           "Mean time per step spent in each phase over the last log window.", (*T, "phase")),
    Metric("fsdpmon_train_data_wait_ratio", Gg, "ratio",
           "Share of step time spent blocked waiting for data over the last log window.", T),
    Metric("fsdpmon_train_mfu_ratio", Gg, "ratio",
           "Model FLOPs utilisation over the last log window (absent for unknown devices).", T),
    Metric("fsdpmon_train_model_flops_per_token", Gg, "",
           "Training FLOPs per token: 6*(N - N_embedding) + 12*layers*heads*head_dim*seq_len.", T),
    Metric("fsdpmon_train_device_peak_flops", Gg, "",
           "Peak dense FLOP/s of this rank's device used for MFU.", T),
    # Memory
    Metric("fsdpmon_train_memory_allocated_bytes", Gg, "bytes",
           "CUDA memory allocated by tensors.", T),
    Metric("fsdpmon_train_memory_reserved_bytes", Gg, "bytes",
           "CUDA memory reserved by the caching allocator.", T),
    Metric("fsdpmon_train_memory_peak_active_bytes", Gg, "bytes",
           "Peak active CUDA memory in the last log window.", T),
    Metric("fsdpmon_train_memory_peak_reserved_bytes", Gg, "bytes",
           "Peak reserved CUDA memory in the last log window.", T),
    Metric("fsdpmon_train_device_memory_capacity_bytes", Gg, "bytes",
           "Total memory of this rank's device.", T),
    Metric("fsdpmon_train_alloc_retries_total", C, "",
           "Allocator retries (cudaMalloc failed, cache flushed and retried).", T),
    Metric("fsdpmon_train_ooms_total", C, "", "Out-of-memory errors seen by the allocator.", T),
    Metric("fsdpmon_train_process_rss_bytes", Gg, "bytes",
           "Resident memory of this rank's process.", T),
    # Quality
    Metric("fsdpmon_train_loss", Gg, "", "Training loss at the last log step.", T),
    Metric("fsdpmon_train_learning_rate", Gg, "", "Learning rate at the last log step.", T),
    Metric("fsdpmon_train_grad_norm", Gg, "", "Gradient norm at the last log step.", T),
    Metric("fsdpmon_train_loss_nonfinite", Gg, "",
           "1 when the last logged loss was NaN or infinite, else 0.", T),
    # Stalls
    Metric("fsdpmon_train_stalled", Gg, "",
           "1 while no step has completed within the stall threshold, else 0.", T),
    Metric("fsdpmon_train_heartbeat_age_seconds", Gg, "seconds",
           "Seconds since the last step completed, as of the scrape.", T),
    Metric("fsdpmon_train_stall_threshold_seconds", Gg, "seconds",
           "Current stall threshold: max(factor x median step time, floor).", T),
    Metric("fsdpmon_train_unresponsive", Gg, "",
           "1 when this rank's process has not run its monitor thread for 5 s (stopped, or "
           "hung holding the GIL): the rank that hangs, not one waiting for it.", T),
    Metric("fsdpmon_monitor_internal_errors_total", C, "",
           "Internal monitor failures (logged once, never raised into training).", T),
    # Job level, published by rank 0 once per log interval
    Metric("fsdpmon_job_step_time_min_seconds", Gg, "seconds",
           "Fastest rank's mean step time over the last log window.", J),
    Metric("fsdpmon_job_step_time_median_seconds", Gg, "seconds",
           "Median over ranks of the mean step time in the last log window.", J),
    Metric("fsdpmon_job_step_time_max_seconds", Gg, "seconds",
           "Slowest rank's mean step time over the last log window.", J),
    Metric("fsdpmon_job_slowest_rank", Gg, "",
           "Rank whose busy time (step time minus collective wait) was highest.", J),
    Metric("fsdpmon_job_slowest_rank_step_time_seconds", Gg, "seconds",
           "Mean step time of the slowest rank over the last log window.", J),
    Metric("fsdpmon_job_peak_memory_max_bytes", Gg, "bytes",
           "Highest peak memory over ranks in the last log window.", J),
    Metric("fsdpmon_job_peak_memory_max_rank", Gg, "", "Rank with the highest peak memory.", J),
    Metric("fsdpmon_job_loss_mean", Gg, "", "Mean loss over ranks at the last log step.", J),
    Metric("fsdpmon_job_loss_max", Gg, "", "Max loss over ranks at the last log step.", J),
    Metric("fsdpmon_job_world_size", Gg, "", "Number of ranks in the job.", J),
)

GPU: tuple[Metric, ...] = (
    Metric("fsdpmon_nvml_up", Gg, "", "1 when NVML initialised on this node, else 0.", ("node",)),
    Metric("fsdpmon_gpu_up", Gg, "", "1 while this GPU answers NVML, 0 once it is lost.", G),
    Metric("fsdpmon_gpu_info", Gg, "", "Static facts about a GPU (value 1).",
           (*G, "driver_version", "cuda_version", "pci_bus_id", "mig_mode")),
    Metric("fsdpmon_gpu_utilization_ratio", Gg, "ratio",
           "Share of time a kernel was running on the GPU.", GP),
    Metric("fsdpmon_gpu_memory_utilization_ratio", Gg, "ratio",
           "Share of time device memory was being read or written.", GP),
    Metric("fsdpmon_gpu_memory_used_bytes", Gg, "bytes", "Device memory in use.", GP),
    Metric("fsdpmon_gpu_memory_free_bytes", Gg, "bytes", "Device memory free.", GP),
    Metric("fsdpmon_gpu_memory_total_bytes", Gg, "bytes", "Device memory in total.", GP),
    Metric("fsdpmon_gpu_memory_reserved_bytes", Gg, "bytes",
           "Device memory reserved by the driver.", GP),
    Metric("fsdpmon_gpu_temperature_celsius", Gg, "celsius", "GPU die temperature.", GP),
    Metric("fsdpmon_gpu_memory_temperature_celsius", Gg, "celsius", "HBM temperature.", GP),
    Metric("fsdpmon_gpu_power_watts", Gg, "watts", "Power draw.", GP),
    Metric("fsdpmon_gpu_power_limit_watts", Gg, "watts", "Enforced power limit.", GP),
    Metric("fsdpmon_gpu_energy_joules_total", C, "joules",
           "Energy consumed since the driver loaded.", GP),
    Metric("fsdpmon_gpu_sm_clock_hertz", Gg, "hertz", "SM clock.", GP),
    Metric("fsdpmon_gpu_memory_clock_hertz", Gg, "hertz", "Memory clock.", GP),
    Metric("fsdpmon_gpu_sm_clock_max_hertz", Gg, "hertz", "Maximum SM clock.", GP),
    Metric("fsdpmon_gpu_memory_clock_max_hertz", Gg, "hertz", "Maximum memory clock.", GP),
    Metric("fsdpmon_gpu_clock_event_active", Gg, "",
           "1 while a clock-event (throttle) reason is active, per reason.", (*GP, "reason")),
    Metric("fsdpmon_gpu_ecc_errors_total", C, "",
           "ECC errors since the driver loaded, by type (corrected/uncorrected).",
           (*GP, "type")),
    Metric("fsdpmon_gpu_remapped_rows", Gg, "",
           "Remapped memory rows, by cause (correctable/uncorrectable/pending/failure).",
           (*GP, "cause")),
    Metric("fsdpmon_gpu_xid_errors_total", C, "", "XID errors seen, by XID code.",
           (*GP, "xid")),
    Metric("fsdpmon_gpu_pcie_bytes_per_second", Gg, "", "PCIe throughput by direction.",
           (*GP, "direction")),
    Metric("fsdpmon_gpu_pcie_replay_errors_total", C, "", "PCIe replay counter.", GP),
    Metric("fsdpmon_gpu_nvlink_bytes_per_second", Gg, "",
           "NVLink throughput summed over links, by direction.", (*GP, "direction")),
    Metric("fsdpmon_gpu_sm_activity_ratio", Gg, "ratio",
           "GPM SM activity (Hopper and newer, where supported).", GP),
    Metric("fsdpmon_gpu_tensor_activity_ratio", Gg, "ratio",
           "GPM tensor-core activity (Hopper and newer, where supported).", GP),
    Metric("fsdpmon_gpu_process_memory_used_bytes", Gg, "bytes",
           "Device memory used by one process on a GPU.", (*GP, "pid")),
    Metric("fsdpmon_gpu_process_sm_utilization_ratio", Gg, "ratio",
           "SM utilisation of one process on a GPU.", (*GP, "pid")),
)

HOST: tuple[Metric, ...] = (
    Metric("fsdpmon_exporter_info", Gg, "", "Static facts about the exporter (value 1).",
           ("node", "version", "simulated")),
    Metric("fsdpmon_exporter_sample_age_seconds", Gg, "seconds",
           "Age of the sample this scrape served.", ("node",)),
    Metric("fsdpmon_exporter_sample_stale", Gg, "",
           "1 when the background sampler has not finished a sample in time.", ("node",)),
    Metric("fsdpmon_exporter_sample_duration_seconds", Gg, "seconds",
           "Time the last background sample took.", ("node", "source")),
    Metric("fsdpmon_exporter_errors_total", C, "", "Errors while sampling, by source.",
           ("node", "source")),
    Metric("fsdpmon_host_cpu_seconds_total", C, "seconds", "Host CPU time by mode.",
           ("node", "mode")),
    Metric("fsdpmon_host_cpu_utilization_ratio", Gg, "ratio",
           "Host CPU busy share, per core and in total (cpu=\"all\").", ("node", "cpu")),
    Metric("fsdpmon_host_load1", Gg, "", "1-minute load average.", ("node",)),
    Metric("fsdpmon_host_load5", Gg, "", "5-minute load average.", ("node",)),
    Metric("fsdpmon_host_load15", Gg, "", "15-minute load average.", ("node",)),
    Metric("fsdpmon_host_memory_total_bytes", Gg, "bytes", "Host memory in total.", ("node",)),
    Metric("fsdpmon_host_memory_available_bytes", Gg, "bytes", "Host memory available.",
           ("node",)),
    Metric("fsdpmon_host_memory_used_bytes", Gg, "bytes", "Host memory in use.", ("node",)),
)

P = ("node", "pid", *POD_LABELS)
PROCESS: tuple[Metric, ...] = (
    Metric("fsdpmon_process_info", Gg, "",
           "A process that uses a GPU or belongs to a training pod (value 1).",
           (*P, "command", "user")),
    Metric("fsdpmon_process_cpu_seconds_total", C, "seconds", "CPU time of the process.", P),
    Metric("fsdpmon_process_cpu_utilization_ratio", Gg, "ratio",
           "CPU use of the process over the last sample, in cores.", P),
    Metric("fsdpmon_process_resident_memory_bytes", Gg, "bytes", "Resident set size.", P),
    Metric("fsdpmon_process_threads", Gg, "", "Threads of the process.", P),
    Metric("fsdpmon_process_state", Gg, "", "1 for the process's current state.",
           (*P, "state")),
    Metric("fsdpmon_process_start_time_seconds", Gg, "seconds",
           "Unix time the process started.", P),
)

ALL: tuple[Metric, ...] = TRAINING + GPU + HOST + PROCESS
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}


def get(name: str) -> Metric:
    """The catalog entry for ``name``; KeyError names the metric when it is not catalogued."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the fsdpmon catalog") from None


def all_series_names() -> frozenset[str]:
    """Every sample name any catalogued metric can expose (for dashboard and rule checks)."""
    return frozenset(s for m in ALL for s in m.series_names())
