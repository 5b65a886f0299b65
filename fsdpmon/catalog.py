"""The metric catalog: the single source of truth for every metric name, type, unit and label.

The in-trainer monitor, the per-node exporter, the dashboards, the alert rules and `fsdpmon top`
all take names from here; tests fail when a dashboard or rule names a metric this module lacks.

Names follow Prometheus practice: prefix ``fsdpmon_``, base unit in the name, counters end in
``_total``, ``*_info`` gauges carry static labels with value 1. ``Metric.name`` is the name as it
appears in the exposition (counters with their ``_total``; histograms without the ``_bucket`` /
``_sum`` / ``_count`` suffixes).

How to refer to a metric (the contract; tests/test_layers.py enforces it):

- Every metric is a module-level symbol: the name without ``fsdpmon_``, upper-cased
  (``fsdpmon_train_loss`` is ``TRAIN_LOSS``, a :class:`Metric`; the string is
  ``TRAIN_LOSS.name``). Every recorded rule is a :class:`Recorded` symbol: ``REC_`` + the name
  without ``fsdpmon_``, ``:`` as ``_`` (``fsdpmon_job:loss:avg`` is ``REC_JOB_LOSS_AVG``).
- Code elsewhere writes ``from fsdpmon import catalog`` and ``catalog.TRAIN_LOSS`` (one style
  everywhere, greppable, no clash with local constants) and never retypes a quoted ``fsdpmon_``
  name. A misspelt symbol raises AttributeError at import where used at module level, and
  tests/test_layers.py fails on any ``catalog.X`` in the code base that this module lacks, so
  it can never become a silently missing series. Renaming a metric is one edit here plus
  ``python -m fsdpmon.dashboards`` to regenerate the dashboards and rules.
- ``get(name)`` / ``BY_NAME`` remain for names that arrive as data (a state file, a scraped
  exposition, a dashboard query).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    GPU_LABELS,
    JOB_LABEL,
    POD_LABELS,
    TRAINING_LABELS,
    UNRESPONSIVE_AFTER_SECONDS,
)


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

# Training: served by the in-trainer monitor on each rank's /metrics.
# Progress
TRAIN_INFO = Metric(
    "fsdpmon_train_info", Gg, "", "Static facts about the run (value 1).",
    (*T, "model", "world_size", "nodes", "dtype", "torch_version", "node", "device"))
TRAIN_STEPS_TOTAL = Metric(
    "fsdpmon_train_steps_total", C, "", "Optimiser steps completed by this process.", T)
TRAIN_STEP = Metric(
    "fsdpmon_train_step", Gg, "", "Global step number of the last completed step.", T)
TRAIN_TOTAL_STEPS = Metric(
    "fsdpmon_train_total_steps", Gg, "", "Planned number of steps, when known.", T)
TRAIN_LAST_STEP_TIMESTAMP_SECONDS = Metric(
    "fsdpmon_train_last_step_timestamp_seconds", Gg, "seconds",
    "Unix time the last step completed: the heartbeat that stall alerts use.", T)
TRAIN_TOKENS_TOTAL = Metric(
    "fsdpmon_train_tokens_total", C, "", "Tokens processed by this rank.", T)
TRAIN_TOKENS_PER_SECOND = Metric(
    "fsdpmon_train_tokens_per_second", Gg, "",
    "Tokens per second on this rank over the last log window.", T)
TRAIN_RESTARTS = Metric(
    "fsdpmon_train_restarts", Gg, "",
    "Times the job was restarted by the elastic agent (TORCHELASTIC_RESTART_COUNT).", T)
TRAIN_PREVIOUS_EXIT = Metric(
    "fsdpmon_train_previous_exit", Gg, "",
    "How this rank's previous incarnation ended, as the process the elastic agent restarted "
    "found it (value 1; absent on a first start or when unknown): killed (it left no word: "
    "SIGKILL, the OOM killer, a segfault), sigterm (stopped by a signal: the agent stopping the "
    "group), error (a Python exception ended it), exit (it finished).", (*T, "how"))
TRAIN_PREVIOUS_EXIT_STEP = Metric(
    "fsdpmon_train_previous_exit_step", Gg, "",
    "The step this rank's previous incarnation ended at (killed: its last log step).", T)
TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS = Metric(
    "fsdpmon_train_previous_exit_timestamp_seconds", Gg, "seconds",
    "Unix time this rank's previous incarnation ended (killed: when its restarted process "
    "found it gone).", T)
# Goodput (rank 0 serves the job's): where the wall-clock time went, by cause
TRAIN_PRODUCTIVE_SECONDS_TOTAL = Metric(
    "fsdpmon_train_productive_seconds_total", C, "seconds",
    "Wall-clock seconds the job spent making steps (not waiting for data, a straggler or a "
    "stall); served by rank 0 for the whole job.", T)
TRAIN_BADPUT_SECONDS_TOTAL = Metric(
    "fsdpmon_train_badput_seconds_total", C, "seconds",
    "Wall-clock seconds the job lost, by cause: startup, data_wait, checkpoint_save, "
    "checkpoint_restore, restart, recompute, stall, straggler_wait; served by rank 0 for the "
    "whole job.", (*T, "cause"))
TRAIN_GOODPUT_RATIO = Metric(
    "fsdpmon_train_goodput_ratio", Gg, "ratio",
    "Share of this incarnation's wall-clock time spent making steps that were kept, so far; "
    "served by rank 0 for the whole job.", T)
# Speed
TRAIN_STEP_DURATION_SECONDS = Metric(
    "fsdpmon_train_step_duration_seconds", H, "seconds",
    "Duration of each optimiser step.", T, STEP_BUCKETS)
TRAIN_STEP_TIME_SECONDS = Metric(
    "fsdpmon_train_step_time_seconds", Gg, "seconds",
    "Mean step duration over the last log window.", T)
TRAIN_PHASE_SECONDS_TOTAL = Metric(
    "fsdpmon_train_phase_seconds_total", C, "seconds",
    "Time spent in each phase of the step (data, forward, backward, optimizer, "
    "checkpoint).", (*T, "phase"))
TRAIN_PHASE_DURATION_SECONDS = Metric(
    "fsdpmon_train_phase_duration_seconds", Gg, "seconds",
    "Mean time per step spent in each phase over the last log window.", (*T, "phase"))
TRAIN_DATA_WAIT_RATIO = Metric(
    "fsdpmon_train_data_wait_ratio", Gg, "ratio",
    "Share of step time spent blocked waiting for data over the last log window.", T)
TRAIN_BUSY_SECONDS = Metric(
    "fsdpmon_train_busy_seconds", Gg, "seconds",
    "Time per step not spent waiting in collectives (median over the recent steps).", T)
TRAIN_COLLECTIVE_WAIT_RATIO = Metric(
    "fsdpmon_train_collective_wait_ratio", Gg, "ratio",
    "Share of step time spent waiting in collectives over the last log window.", T)
TRAIN_STRAGGLER_SCORE = Metric(
    "fsdpmon_train_straggler_score", Gg, "",
    "Median busy time of the other ranks / this rank's busy time (below the threshold: a "
    "straggler).",
    T)
TRAIN_STRAGGLING = Metric(
    "fsdpmon_train_straggling", Gg, "",
    "1 while this rank is a straggler: its straggler score below the threshold in every log "
    "window over at least two busy-time medians that share no step and the diagnosis "
    f"evidence time ({DIAGNOSIS_EVIDENCE_SECONDS:g} s); it clears the same way. One low "
    "window is noise, not a straggler.", T)
# The bound the rank judges its score by (STRAGGLER_SCORE_THRESHOLD), published so that the
# alert rules compare each score with the rank's own line rather than a constant of their own.
TRAIN_STRAGGLER_SCORE_THRESHOLD = Metric(
    "fsdpmon_train_straggler_score_threshold", Gg, "",
    "The straggler score below which this rank's monitor calls it a straggler (and the "
    "waited-for score below which the others wait for it).", T)
TRAIN_WAITED_FOR_SCORE = Metric(
    "fsdpmon_train_waited_for_score", Gg, "",
    "Median over the other ranks of their time per step not waiting for peers (own work plus "
    "waiting for a CPU) / this rank's, over at least 10 s: below the straggler threshold the "
    "others wait for this rank, whatever slows it. Low here but not in the straggler score "
    "(busy time only): starved of CPU.", T)
TRAIN_DESCHEDULED_RATIO = Metric(
    "fsdpmon_train_descheduled_ratio", Gg, "ratio",
    "Share of step time this rank's training thread was runnable but waiting for a CPU "
    "(run-queue delay from /proc/thread-self/schedstat: other processes on its cores, or its "
    "cgroup's CPU limit), median over the recent steps (at least 10 s). CPU hosts.", T)
TRAIN_CPU_THROTTLED_RATIO = Metric(
    "fsdpmon_train_cpu_throttled_ratio", Gg, "ratio",
    "Share of the CFS periods in the last log window in which this rank's cgroup (its "
    "container: the pod's CPU limit) was throttled: cpu.stat nr_throttled / nr_periods, as "
    "cAdvisor's container_cpu_cfs_throttled_periods_total; 0 without a limit.", T)
TRAIN_CHECKPOINT_SECONDS = Metric(
    "fsdpmon_train_checkpoint_seconds", Gg, "seconds",
    "Wall time of this rank's last checkpoint save.", T)
TRAIN_CHECKPOINT_OWN_SECONDS = Metric(
    "fsdpmon_train_checkpoint_own_seconds", Gg, "seconds",
    "Of this rank's last checkpoint save, the time not spent waiting in collectives for the "
    "other ranks: its own work (the rank the others waited for has the most).", T)
TRAIN_CHECKPOINT_TIME_RATIO = Metric(
    "fsdpmon_train_checkpoint_time_ratio", Gg, "ratio",
    "Share of wall time this rank's last checkpoint save took, from the end of the previous "
    "save (or the first step) to the end of this one.", T)
TRAIN_MFU_RATIO = Metric(
    "fsdpmon_train_mfu_ratio", Gg, "ratio",
    "Model FLOPs utilisation over the last log window (absent for unknown devices).", T)
TRAIN_MODEL_FLOPS_PER_TOKEN = Metric(
    "fsdpmon_train_model_flops_per_token", Gg, "",
    "Training FLOPs per token: 6*(N - N_embedding) + 12*layers*heads*head_dim*seq_len.", T)
TRAIN_DEVICE_PEAK_FLOPS = Metric(
    "fsdpmon_train_device_peak_flops", Gg, "",
    "Peak dense FLOP/s of this rank's device used for MFU.", T)
# Memory
TRAIN_MEMORY_ALLOCATED_BYTES = Metric(
    "fsdpmon_train_memory_allocated_bytes", Gg, "bytes",
    "CUDA memory allocated by tensors.", T)
TRAIN_MEMORY_RESERVED_BYTES = Metric(
    "fsdpmon_train_memory_reserved_bytes", Gg, "bytes",
    "CUDA memory reserved by the caching allocator.", T)
TRAIN_MEMORY_PEAK_ACTIVE_BYTES = Metric(
    "fsdpmon_train_memory_peak_active_bytes", Gg, "bytes",
    "Peak active CUDA memory in the last log window.", T)
TRAIN_MEMORY_PEAK_RESERVED_BYTES = Metric(
    "fsdpmon_train_memory_peak_reserved_bytes", Gg, "bytes",
    "Peak reserved CUDA memory in the last log window.", T)
TRAIN_DEVICE_MEMORY_CAPACITY_BYTES = Metric(
    "fsdpmon_train_device_memory_capacity_bytes", Gg, "bytes",
    "Total memory of this rank's device.", T)
TRAIN_ALLOC_RETRIES_TOTAL = Metric(
    "fsdpmon_train_alloc_retries_total", C, "",
    "Allocator retries (cudaMalloc failed, cache flushed and retried).", T)
TRAIN_OOMS_TOTAL = Metric(
    "fsdpmon_train_ooms_total", C, "", "Out-of-memory errors seen by the allocator.", T)
TRAIN_PROCESS_RSS_BYTES = Metric(
    "fsdpmon_train_process_rss_bytes", Gg, "bytes",
    "Resident memory of this rank's process.", T)
# Quality
TRAIN_LOSS = Metric("fsdpmon_train_loss", Gg, "", "Training loss at the last log step.", T)
TRAIN_LEARNING_RATE = Metric(
    "fsdpmon_train_learning_rate", Gg, "", "Learning rate at the last log step.", T)
TRAIN_GRAD_NORM = Metric(
    "fsdpmon_train_grad_norm", Gg, "", "Gradient norm at the last log step.", T)
TRAIN_LOSS_NONFINITE = Metric(
    "fsdpmon_train_loss_nonfinite", Gg, "",
    "1 when the last logged loss was NaN or infinite, else 0.", T)
TRAIN_LOSS_FIRST_NONFINITE_STEP = Metric(
    "fsdpmon_train_loss_first_nonfinite_step", Gg, "",
    "The first step at which this rank's loss was NaN or infinite (absent until then); the "
    "rank's JSONL holds that step's batch. The earliest rank is where it was born: the gradient "
    "reduce spreads it to every rank's grad norm the same step, to their loss the next.", T)
TRAIN_GRAD_NORM_FIRST_NONFINITE_STEP = Metric(
    "fsdpmon_train_grad_norm_first_nonfinite_step", Gg, "",
    "The first step at which this rank's gradient norm was NaN or infinite (absent until "
    "then).", T)
# Stalls
TRAIN_STALLED = Metric(
    "fsdpmon_train_stalled", Gg, "",
    "1 while no step has completed within the stall threshold, else 0.", T)
TRAIN_HEARTBEAT_AGE_SECONDS = Metric(
    "fsdpmon_train_heartbeat_age_seconds", Gg, "seconds",
    "Seconds since the last step completed, as of the scrape.", T)
TRAIN_STALL_THRESHOLD_SECONDS = Metric(
    "fsdpmon_train_stall_threshold_seconds", Gg, "seconds",
    "This rank's stall bound: max(FSDPMON_STALL_FACTOR x its median step time, "
    "FSDPMON_STALL_FLOOR_SECONDS); the stall alerts compare its time since the last step with "
    "it.", T)
TRAIN_UNRESPONSIVE = Metric(
    "fsdpmon_train_unresponsive", Gg, "",
    f"1 when this rank's process has not run its monitor thread for "
    f"{UNRESPONSIVE_AFTER_SECONDS:g} s (stopped, or "
    "hung holding the GIL): the rank that hangs, not one waiting for it.", T)
# Progress evidence: where each rank is now, so that Prometheus can name the rank a stalled
# job waits for (the culprit rules) without stacks. Written by the monitor's heartbeat (every
# step and every watchdog tick), no cost of its own per step.
TRAIN_COLLECTIVE_ENTERED_SEQ = Metric(
    "fsdpmon_train_collective_entered_seq", Gg, "",
    "Sequence number of the last collective this rank entered (its calls numbered from 1 in "
    "call order, the same on every rank that made the same calls): a rank below the others' "
    "is behind, the one they wait for.", T)
TRAIN_COLLECTIVE_COMPLETED_SEQ = Metric(
    "fsdpmon_train_collective_completed_seq", Gg, "",
    "Sequence number of the last collective this rank completed (returned from).", T)
TRAIN_IN_COLLECTIVE = Metric(
    "fsdpmon_train_in_collective", Gg, "",
    "1 while this rank is inside a collective call (waiting for its peers or moving data), "
    "else 0.", T)
TRAIN_PHASE = Metric(
    "fsdpmon_train_phase", Gg, "",
    "1 for the phase this rank is in now, 0 for the others (data, forward, backward, "
    "optimizer, checkpoint, other).", (*T, "phase"))
TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS = Metric(
    "fsdpmon_train_position_since_timestamp_seconds", Gg, "seconds",
    "Unix time this rank got where it is now (its step, phase, last collective and whether it "
    "is inside it); it stays put while the rank is stuck there (to about a second).", T)
# Collective identity (issue 51): what each rank's collectives were, so that ranks that made
# different calls (a desync) are told apart from ranks that only wait. Op and dtype are codes
# (no free text in a series): index + 1 in fsdpmon.conventions.OPS / DTYPE_NAMES.
TRAIN_STEP_COLLECTIVE_CALLS = Metric(
    "fsdpmon_train_step_collective_calls", Gg, "",
    "Collectives this rank made in its last completed step (the step fsdpmon_train_step "
    "names).", T)
TRAIN_STEP_COLLECTIVE_FINGERPRINT = Metric(
    "fsdpmon_train_step_collective_fingerprint", Gg, "",
    "Rolling hash of the (op, elements, dtype) of each collective of this rank's last "
    "completed step: ranks that made the same calls at the same step have the same.", T)
TRAIN_STEP_COLLECTIVE_END_SEQ = Metric(
    "fsdpmon_train_step_collective_end_seq", Gg, "",
    "Sequence number of this rank's last collective when its last completed step ended: "
    "ranks at equal steps that made the same calls have the same.", T)
TRAIN_COLLECTIVE_ENTERED_OP = Metric(
    "fsdpmon_train_collective_entered_op", Gg, "",
    "Code of the last collective this rank entered (index + 1 in "
    "fsdpmon.conventions.OPS; 0: none).", T)
TRAIN_COLLECTIVE_ENTERED_ELEMENTS = Metric(
    "fsdpmon_train_collective_entered_elements", Gg, "",
    "Elements of the first tensor of the last collective this rank entered.", T)
TRAIN_COLLECTIVE_ENTERED_DTYPE = Metric(
    "fsdpmon_train_collective_entered_dtype", Gg, "",
    "Code of that tensor's dtype (index + 1 in fsdpmon.conventions.DTYPE_NAMES; 0: "
    "none or another).", T)
TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN = Metric(
    "fsdpmon_train_collective_entered_off_pattern", Gg, "",
    "1 when the last collective this rank entered differs from the one it made at the same "
    "position in its step before (or is beyond that step's calls), else 0.", T)
# The rank's last pattern break: the first call of a step that differed from its step before's
# at the same position, kept until another step breaks it (a desync that repeats every step
# breaks the pattern once). Published with the rank's snapshot, absent before any break.
TRAIN_COLLECTIVE_BREAK_STEP = Metric(
    "fsdpmon_train_collective_break_step", Gg, "",
    "The last step whose collectives broke this rank's own pattern (its first call differing "
    "from the step before's at the same position, or past its end, or missing).", T)
TRAIN_COLLECTIVE_BREAK_INDEX = Metric(
    "fsdpmon_train_collective_break_index", Gg, "",
    "Position in that step (from 1) of its first call off the pattern.", T)
TRAIN_COLLECTIVE_BREAK_OP = Metric(
    "fsdpmon_train_collective_break_op", Gg, "",
    "Code of that call (as fsdpmon_train_collective_entered_op; absent: the step ended "
    "there, a call short).", T)
TRAIN_COLLECTIVE_BREAK_ELEMENTS = Metric(
    "fsdpmon_train_collective_break_elements", Gg, "", "Elements of that call.", T)
TRAIN_COLLECTIVE_BREAK_DTYPE = Metric(
    "fsdpmon_train_collective_break_dtype", Gg, "", "Dtype code of that call.", T)
TRAIN_COLLECTIVE_BREAK_EXPECTED_OP = Metric(
    "fsdpmon_train_collective_break_expected_op", Gg, "",
    "Code of the call the step before made at that position (absent: an extra call past the "
    "step before's end).", T)
TRAIN_COLLECTIVE_BREAK_EXPECTED_ELEMENTS = Metric(
    "fsdpmon_train_collective_break_expected_elements", Gg, "",
    "Elements of the call the step before made there.", T)
TRAIN_COLLECTIVE_BREAK_EXPECTED_DTYPE = Metric(
    "fsdpmon_train_collective_break_expected_dtype", Gg, "",
    "Dtype code of the call the step before made there.", T)
TRAIN_COLLECTIVE_BREAK_SITE_INFO = Metric(
    "fsdpmon_train_collective_break_site_info", Gg, "",
    "1, labelled with the call site of the last pattern break's call ('train.py:123 in "
    "train_step': the first frame outside torch and fsdpmon).", (*T, "site"))
MONITOR_INTERNAL_ERRORS_TOTAL = Metric(
    "fsdpmon_monitor_internal_errors_total", C, "",
    "Internal monitor failures (logged once, never raised into training).", T)
# Job level, published by rank 0 once per log interval
JOB_STEP_TIME_MIN_SECONDS = Metric(
    "fsdpmon_job_step_time_min_seconds", Gg, "seconds",
    "Fastest rank's mean step time over the last log window.", J)
JOB_STEP_TIME_MEDIAN_SECONDS = Metric(
    "fsdpmon_job_step_time_median_seconds", Gg, "seconds",
    "Median over ranks of the mean step time in the last log window.", J)
JOB_STEP_TIME_MAX_SECONDS = Metric(
    "fsdpmon_job_step_time_max_seconds", Gg, "seconds",
    "Slowest rank's mean step time over the last log window.", J)
JOB_SLOWEST_RANK = Metric(
    "fsdpmon_job_slowest_rank", Gg, "",
    "Rank with the lowest straggler score (busy time: step time minus collective wait, "
    "highest).", J)
JOB_SLOWEST_RANK_STEP_TIME_SECONDS = Metric(
    "fsdpmon_job_slowest_rank_step_time_seconds", Gg, "seconds",
    "Mean step time of the slowest rank over the last log window.", J)
JOB_PEAK_MEMORY_MAX_BYTES = Metric(
    "fsdpmon_job_peak_memory_max_bytes", Gg, "bytes",
    "Highest peak memory over ranks in the last log window.", J)
JOB_PEAK_MEMORY_MAX_RANK = Metric(
    "fsdpmon_job_peak_memory_max_rank", Gg, "", "Rank with the highest peak memory.", J)
JOB_LOSS_MEAN = Metric(
    "fsdpmon_job_loss_mean", Gg, "", "Mean loss over ranks at the last log step.", J)
JOB_LOSS_MAX = Metric(
    "fsdpmon_job_loss_max", Gg, "", "Max loss over ranks at the last log step.", J)
JOB_WORLD_SIZE = Metric("fsdpmon_job_world_size", Gg, "", "Number of ranks in the job.", J)
TRAINING: tuple[Metric, ...] = (
    TRAIN_INFO, TRAIN_STEPS_TOTAL, TRAIN_STEP, TRAIN_TOTAL_STEPS,
    TRAIN_LAST_STEP_TIMESTAMP_SECONDS, TRAIN_TOKENS_TOTAL, TRAIN_TOKENS_PER_SECOND,
    TRAIN_RESTARTS, TRAIN_PREVIOUS_EXIT, TRAIN_PREVIOUS_EXIT_STEP,
    TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS, TRAIN_PRODUCTIVE_SECONDS_TOTAL,
    TRAIN_BADPUT_SECONDS_TOTAL, TRAIN_GOODPUT_RATIO, TRAIN_STEP_DURATION_SECONDS,
    TRAIN_STEP_TIME_SECONDS,
    TRAIN_PHASE_SECONDS_TOTAL, TRAIN_PHASE_DURATION_SECONDS, TRAIN_DATA_WAIT_RATIO,
    TRAIN_BUSY_SECONDS, TRAIN_COLLECTIVE_WAIT_RATIO, TRAIN_STRAGGLER_SCORE, TRAIN_STRAGGLING,
    TRAIN_STRAGGLER_SCORE_THRESHOLD,
    TRAIN_WAITED_FOR_SCORE, TRAIN_DESCHEDULED_RATIO, TRAIN_CPU_THROTTLED_RATIO,
    TRAIN_CHECKPOINT_SECONDS, TRAIN_CHECKPOINT_OWN_SECONDS, TRAIN_CHECKPOINT_TIME_RATIO,
    TRAIN_MFU_RATIO, TRAIN_MODEL_FLOPS_PER_TOKEN, TRAIN_DEVICE_PEAK_FLOPS,
    TRAIN_MEMORY_ALLOCATED_BYTES, TRAIN_MEMORY_RESERVED_BYTES, TRAIN_MEMORY_PEAK_ACTIVE_BYTES,
    TRAIN_MEMORY_PEAK_RESERVED_BYTES, TRAIN_DEVICE_MEMORY_CAPACITY_BYTES,
    TRAIN_ALLOC_RETRIES_TOTAL, TRAIN_OOMS_TOTAL, TRAIN_PROCESS_RSS_BYTES, TRAIN_LOSS,
    TRAIN_LEARNING_RATE, TRAIN_GRAD_NORM, TRAIN_LOSS_NONFINITE, TRAIN_LOSS_FIRST_NONFINITE_STEP,
    TRAIN_GRAD_NORM_FIRST_NONFINITE_STEP, TRAIN_STALLED,
    TRAIN_HEARTBEAT_AGE_SECONDS, TRAIN_STALL_THRESHOLD_SECONDS, TRAIN_UNRESPONSIVE,
    TRAIN_COLLECTIVE_ENTERED_SEQ, TRAIN_COLLECTIVE_COMPLETED_SEQ, TRAIN_IN_COLLECTIVE,
    TRAIN_PHASE, TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS, TRAIN_STEP_COLLECTIVE_CALLS,
    TRAIN_STEP_COLLECTIVE_FINGERPRINT, TRAIN_STEP_COLLECTIVE_END_SEQ, TRAIN_COLLECTIVE_ENTERED_OP,
    TRAIN_COLLECTIVE_ENTERED_ELEMENTS, TRAIN_COLLECTIVE_ENTERED_DTYPE,
    TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN, TRAIN_COLLECTIVE_BREAK_STEP,
    TRAIN_COLLECTIVE_BREAK_INDEX, TRAIN_COLLECTIVE_BREAK_OP, TRAIN_COLLECTIVE_BREAK_ELEMENTS,
    TRAIN_COLLECTIVE_BREAK_DTYPE, TRAIN_COLLECTIVE_BREAK_EXPECTED_OP,
    TRAIN_COLLECTIVE_BREAK_EXPECTED_ELEMENTS, TRAIN_COLLECTIVE_BREAK_EXPECTED_DTYPE,
    TRAIN_COLLECTIVE_BREAK_SITE_INFO, MONITOR_INTERNAL_ERRORS_TOTAL,
    JOB_STEP_TIME_MIN_SECONDS, JOB_STEP_TIME_MEDIAN_SECONDS,
    JOB_STEP_TIME_MAX_SECONDS, JOB_SLOWEST_RANK, JOB_SLOWEST_RANK_STEP_TIME_SECONDS,
    JOB_PEAK_MEMORY_MAX_BYTES, JOB_PEAK_MEMORY_MAX_RANK, JOB_LOSS_MEAN, JOB_LOSS_MAX,
    JOB_WORLD_SIZE,
)

# GPUs: served by the per-node exporter (NVML), or recorded from dcgm-exporter's names.
NVML_UP = Metric(
    "fsdpmon_nvml_up", Gg, "", "1 when NVML initialised on this node, else 0.", ("node",))
GPU_UP = Metric("fsdpmon_gpu_up", Gg, "", "1 while this GPU answers NVML, 0 once it is lost.", G)
GPU_INFO = Metric(
    "fsdpmon_gpu_info", Gg, "", "Static facts about a GPU (value 1).",
    (*G, "driver_version", "cuda_version", "pci_bus_id", "mig_mode"))
GPU_UTILIZATION_RATIO = Metric(
    "fsdpmon_gpu_utilization_ratio", Gg, "ratio",
    "Share of time a kernel was running on the GPU.", GP)
GPU_MEMORY_UTILIZATION_RATIO = Metric(
    "fsdpmon_gpu_memory_utilization_ratio", Gg, "ratio",
    "Share of time device memory was being read or written.", GP)
GPU_MEMORY_USED_BYTES = Metric(
    "fsdpmon_gpu_memory_used_bytes", Gg, "bytes", "Device memory in use.", GP)
GPU_MEMORY_FREE_BYTES = Metric(
    "fsdpmon_gpu_memory_free_bytes", Gg, "bytes", "Device memory free.", GP)
GPU_MEMORY_TOTAL_BYTES = Metric(
    "fsdpmon_gpu_memory_total_bytes", Gg, "bytes", "Device memory in total.", GP)
GPU_MEMORY_RESERVED_BYTES = Metric(
    "fsdpmon_gpu_memory_reserved_bytes", Gg, "bytes",
    "Device memory reserved by the driver.", GP)
GPU_TEMPERATURE_CELSIUS = Metric(
    "fsdpmon_gpu_temperature_celsius", Gg, "celsius", "GPU die temperature.", GP)
GPU_MEMORY_TEMPERATURE_CELSIUS = Metric(
    "fsdpmon_gpu_memory_temperature_celsius", Gg, "celsius", "HBM temperature.", GP)
GPU_POWER_WATTS = Metric("fsdpmon_gpu_power_watts", Gg, "watts", "Power draw.", GP)
GPU_POWER_LIMIT_WATTS = Metric(
    "fsdpmon_gpu_power_limit_watts", Gg, "watts", "Enforced power limit.", GP)
GPU_ENERGY_JOULES_TOTAL = Metric(
    "fsdpmon_gpu_energy_joules_total", C, "joules",
    "Energy consumed since the driver loaded.", GP)
GPU_SM_CLOCK_HERTZ = Metric("fsdpmon_gpu_sm_clock_hertz", Gg, "hertz", "SM clock.", GP)
GPU_MEMORY_CLOCK_HERTZ = Metric("fsdpmon_gpu_memory_clock_hertz", Gg, "hertz", "Memory clock.", GP)
GPU_SM_CLOCK_MAX_HERTZ = Metric(
    "fsdpmon_gpu_sm_clock_max_hertz", Gg, "hertz", "Maximum SM clock.", GP)
GPU_MEMORY_CLOCK_MAX_HERTZ = Metric(
    "fsdpmon_gpu_memory_clock_max_hertz", Gg, "hertz", "Maximum memory clock.", GP)
GPU_CLOCK_EVENT_ACTIVE = Metric(
    "fsdpmon_gpu_clock_event_active", Gg, "",
    "1 while a clock-event (throttle) reason is active, per reason.", (*GP, "reason"))
GPU_CLOCK_EVENT_REASONS = Metric(
    "fsdpmon_gpu_clock_event_reasons", Gg, "",
    "The active clock-event (throttle) reasons as NVML's bitmask (the bits of "
    "conventions.GPU_CLOCK_EVENT_BITS; dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS): "
    "fsdpmon_gpu_clock_event_active in one series per GPU, for readers of every GPU at once.",
    GP)
GPU_CLOCK_EVENT_SECONDS_TOTAL = Metric(
    "fsdpmon_gpu_clock_event_seconds_total", C, "seconds",
    "Time clocks were held down since the driver loaded, per clock-event reason (NVML's "
    "accumulated clock-event time; reasons NVML counts: sw_power_cap, sync_boost, "
    "sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown).", (*GP, "reason"))
GPU_ECC_ERRORS_TOTAL = Metric(
    "fsdpmon_gpu_ecc_errors_total", C, "",
    "ECC errors since the driver loaded, by type (corrected/uncorrected).",
    (*GP, "type"))
GPU_REMAPPED_ROWS = Metric(
    "fsdpmon_gpu_remapped_rows", Gg, "",
    "Remapped memory rows, by cause (correctable/uncorrectable/pending/failure).",
    (*GP, "cause"))
GPU_XID_ERRORS_TOTAL = Metric(
    "fsdpmon_gpu_xid_errors_total", C, "", "XID errors seen, by XID code.",
    (*GP, "xid"))
GPU_PCIE_BYTES_PER_SECOND = Metric(
    "fsdpmon_gpu_pcie_bytes_per_second", Gg, "", "PCIe throughput by direction.",
    (*GP, "direction"))
GPU_PCIE_REPLAY_ERRORS_TOTAL = Metric(
    "fsdpmon_gpu_pcie_replay_errors_total", C, "", "PCIe replay counter.", GP)
GPU_NVLINK_BYTES_PER_SECOND = Metric(
    "fsdpmon_gpu_nvlink_bytes_per_second", Gg, "",
    "NVLink throughput summed over links, by direction.", (*GP, "direction"))
GPU_SM_ACTIVITY_RATIO = Metric(
    "fsdpmon_gpu_sm_activity_ratio", Gg, "ratio",
    "GPM SM activity (Hopper and newer, where supported).", GP)
GPU_TENSOR_ACTIVITY_RATIO = Metric(
    "fsdpmon_gpu_tensor_activity_ratio", Gg, "ratio",
    "GPM tensor-core activity (Hopper and newer, where supported).", GP)
GPU_PROCESS_MEMORY_USED_BYTES = Metric(
    "fsdpmon_gpu_process_memory_used_bytes", Gg, "bytes",
    "Device memory used by one process on a GPU.", (*GP, "pid"))
GPU_PROCESS_SM_UTILIZATION_RATIO = Metric(
    "fsdpmon_gpu_process_sm_utilization_ratio", Gg, "ratio",
    "SM utilisation of one process on a GPU.", (*GP, "pid"))
GPU: tuple[Metric, ...] = (
    NVML_UP, GPU_UP, GPU_INFO, GPU_UTILIZATION_RATIO, GPU_MEMORY_UTILIZATION_RATIO,
    GPU_MEMORY_USED_BYTES, GPU_MEMORY_FREE_BYTES, GPU_MEMORY_TOTAL_BYTES,
    GPU_MEMORY_RESERVED_BYTES, GPU_TEMPERATURE_CELSIUS, GPU_MEMORY_TEMPERATURE_CELSIUS,
    GPU_POWER_WATTS, GPU_POWER_LIMIT_WATTS, GPU_ENERGY_JOULES_TOTAL, GPU_SM_CLOCK_HERTZ,
    GPU_MEMORY_CLOCK_HERTZ, GPU_SM_CLOCK_MAX_HERTZ, GPU_MEMORY_CLOCK_MAX_HERTZ,
    GPU_CLOCK_EVENT_ACTIVE, GPU_CLOCK_EVENT_REASONS, GPU_CLOCK_EVENT_SECONDS_TOTAL,
    GPU_ECC_ERRORS_TOTAL,
    GPU_REMAPPED_ROWS, GPU_XID_ERRORS_TOTAL,
    GPU_PCIE_BYTES_PER_SECOND, GPU_PCIE_REPLAY_ERRORS_TOTAL, GPU_NVLINK_BYTES_PER_SECOND,
    GPU_SM_ACTIVITY_RATIO, GPU_TENSOR_ACTIVITY_RATIO, GPU_PROCESS_MEMORY_USED_BYTES,
    GPU_PROCESS_SM_UTILIZATION_RATIO,
)

# The exporter itself and its host.
EXPORTER_INFO = Metric(
    "fsdpmon_exporter_info", Gg, "", "Static facts about the exporter (value 1).",
    ("node", "version", "simulated"))
EXPORTER_SAMPLE_AGE_SECONDS = Metric(
    "fsdpmon_exporter_sample_age_seconds", Gg, "seconds",
    "Age of the sample this scrape served.", ("node",))
EXPORTER_SAMPLE_STALE = Metric(
    "fsdpmon_exporter_sample_stale", Gg, "",
    "1 when the background sampler has not finished a sample in time.", ("node",))
EXPORTER_SAMPLE_DURATION_SECONDS = Metric(
    "fsdpmon_exporter_sample_duration_seconds", Gg, "seconds",
    "Time the last background sample took.", ("node", "source"))
EXPORTER_ERRORS_TOTAL = Metric(
    "fsdpmon_exporter_errors_total", C, "", "Errors while sampling, by source.",
    ("node", "source"))
HOST_CPU_SECONDS_TOTAL = Metric(
    "fsdpmon_host_cpu_seconds_total", C, "seconds", "Host CPU time by mode.",
    ("node", "mode"))
HOST_CPU_UTILIZATION_RATIO = Metric(
    "fsdpmon_host_cpu_utilization_ratio", Gg, "ratio",
    "Host CPU busy share in total (one series, cpu=\"all\"; per core: "
    "fsdpmon_host_cpu_core_utilization_ratio).", ("node", "cpu"))
HOST_CPU_CORE_UTILIZATION_RATIO = Metric(
    "fsdpmon_host_cpu_core_utilization_ratio", Gg, "ratio",
    "Host CPU busy share per core (cpu=\"0\", \"1\", ...).", ("node", "cpu"))
HOST_LOAD1 = Metric("fsdpmon_host_load1", Gg, "", "1-minute load average.", ("node",))
HOST_LOAD5 = Metric("fsdpmon_host_load5", Gg, "", "5-minute load average.", ("node",))
HOST_LOAD15 = Metric("fsdpmon_host_load15", Gg, "", "15-minute load average.", ("node",))
HOST_MEMORY_TOTAL_BYTES = Metric(
    "fsdpmon_host_memory_total_bytes", Gg, "bytes", "Host memory in total.", ("node",))
HOST_MEMORY_AVAILABLE_BYTES = Metric(
    "fsdpmon_host_memory_available_bytes", Gg, "bytes", "Host memory available.",
    ("node",))
HOST_MEMORY_USED_BYTES = Metric(
    "fsdpmon_host_memory_used_bytes", Gg, "bytes", "Host memory in use.", ("node",))
HOST: tuple[Metric, ...] = (
    EXPORTER_INFO, EXPORTER_SAMPLE_AGE_SECONDS, EXPORTER_SAMPLE_STALE,
    EXPORTER_SAMPLE_DURATION_SECONDS, EXPORTER_ERRORS_TOTAL, HOST_CPU_SECONDS_TOTAL,
    HOST_CPU_UTILIZATION_RATIO, HOST_CPU_CORE_UTILIZATION_RATIO, HOST_LOAD1, HOST_LOAD5,
    HOST_LOAD15, HOST_MEMORY_TOTAL_BYTES, HOST_MEMORY_AVAILABLE_BYTES, HOST_MEMORY_USED_BYTES,
)

P = ("node", "pid", *POD_LABELS)
# Processes that use a GPU or belong to a training pod (exporter).
PROCESS_INFO = Metric(
    "fsdpmon_process_info", Gg, "",
    "A process that uses a GPU or belongs to a training pod (value 1); rank and local_rank "
    "from its RANK / LOCAL_RANK environment (empty when not a torchrun worker) tie a GPU's "
    "processes to training ranks.",
    (*P, "command", "user", "rank", "local_rank"))
PROCESS_CPU_SECONDS_TOTAL = Metric(
    "fsdpmon_process_cpu_seconds_total", C, "seconds", "CPU time of the process.", P)
PROCESS_CPU_UTILIZATION_RATIO = Metric(
    "fsdpmon_process_cpu_utilization_ratio", Gg, "ratio",
    "CPU use of the process over the last sample, in cores.", P)
PROCESS_RESIDENT_MEMORY_BYTES = Metric(
    "fsdpmon_process_resident_memory_bytes", Gg, "bytes", "Resident set size.", P)
PROCESS_THREADS = Metric("fsdpmon_process_threads", Gg, "", "Threads of the process.", P)
PROCESS_STATE = Metric(
    "fsdpmon_process_state", Gg, "", "1 for the process's current state.",
    (*P, "state"))
PROCESS_START_TIME_SECONDS = Metric(
    "fsdpmon_process_start_time_seconds", Gg, "seconds",
    "Unix time the process started.", P)
PROCESS: tuple[Metric, ...] = (
    PROCESS_INFO, PROCESS_CPU_SECONDS_TOTAL, PROCESS_CPU_UTILIZATION_RATIO,
    PROCESS_RESIDENT_MEMORY_BYTES, PROCESS_THREADS, PROCESS_STATE, PROCESS_START_TIME_SECONDS,
)

ALL: tuple[Metric, ...] = TRAINING + GPU + HOST + PROCESS
BY_NAME: dict[str, Metric] = {m.name: m for m in ALL}


@dataclass(frozen=True)
class Recorded:
    """A series that a Prometheus recording rule makes (``level:metric:operations``).

    dashboards/rules.py holds the expression; dashboards and alerts read the series by symbol.
    """

    name: str


# Job level: one series per namespace/job_name.
REC_JOB_TOKENS_PER_SECOND_SUM = Recorded("fsdpmon_job:tokens_per_second:sum")
REC_JOB_TOKENS_PER_SECOND_PER_RANK_AVG = Recorded("fsdpmon_job:tokens_per_second_per_rank:avg")
REC_JOB_RANKS_COUNT = Recorded("fsdpmon_job:ranks:count")
REC_JOB_HEARTBEAT_AGE_SECONDS_MAX = Recorded("fsdpmon_job:heartbeat_age_seconds:max")
REC_JOB_STEP_TIME_SECONDS_MAX = Recorded("fsdpmon_job:step_time_seconds:max")
REC_JOB_STEP_TIME_SECONDS_P50 = Recorded("fsdpmon_job:step_time_seconds:p50")
REC_JOB_MFU_RATIO_AVG = Recorded("fsdpmon_job:mfu_ratio:avg")
REC_JOB_LOSS_AVG = Recorded("fsdpmon_job:loss:avg")
REC_JOB_LOSS_MAX = Recorded("fsdpmon_job:loss:max")
REC_JOB_DATA_WAIT_RATIO_MAX = Recorded("fsdpmon_job:data_wait_ratio:max")
REC_JOB_PEAK_MEMORY_BYTES_MAX = Recorded("fsdpmon_job:peak_memory_bytes:max")
REC_JOB_STEP_MAX = Recorded("fsdpmon_job:step:max")
REC_JOB_TOTAL_STEPS_MAX = Recorded("fsdpmon_job:total_steps:max")
REC_JOB_STEPS_PER_SECOND_RATE5M = Recorded("fsdpmon_job:steps_per_second:rate5m")
REC_JOB_ETA_SECONDS_ESTIMATE = Recorded("fsdpmon_job:eta_seconds:estimate")
# Stall culprits (dashboards/culprits.py): who a stalled job waits for, from the progress
# evidence. A job is stalled while any of its ranks is past its stall bound.
REC_JOB_STALLED_RANKS_COUNT = Recorded("fsdpmon_job:stalled_ranks:count")
# Of a stalled job, the ranks inside a collective: the ones that wait.
REC_JOB_WAITING_RANKS_COUNT = Recorded("fsdpmon_job:waiting_ranks:count")
REC_JOB_COLLECTIVE_ENTERED_SEQ_MAX = Recorded("fsdpmon_job:collective_entered_seq:max")
# One series per culprit rank of a stalled job (the rank's own labels: rank, pod, node, ...),
# with `cause` (hang, rank_unresponsive) and `reason` (unresponsive: its process runs no
# Python; behind: its last collective is below the others'; outside: it is outside a
# collective while others wait inside one); the value is how long (s) it has been where it is.
REC_RANK_STALL_CULPRIT_SECONDS = Recorded("fsdpmon_rank:stall_culprit:seconds")
# Node, pod and GPU level.
REC_NODE_GPU_UTILIZATION_RATIO_AVG = Recorded("fsdpmon_node:gpu_utilization_ratio:avg")
REC_NODE_GPU_MEMORY_USED_BYTES_SUM = Recorded("fsdpmon_node:gpu_memory_used_bytes:sum")
REC_NODE_GPU_POWER_WATTS_SUM = Recorded("fsdpmon_node:gpu_power_watts:sum")
REC_POD_GPU_MEMORY_USED_BYTES_SUM = Recorded("fsdpmon_pod:gpu_memory_used_bytes:sum")
REC_GPU_MEMORY_USED_BYTES_RATIO = Recorded("fsdpmon_gpu:memory_used_bytes:ratio")
REC_GPU_DCGM_XID_ERRORS_CHANGES = Recorded("fsdpmon_gpu:dcgm_xid_errors:changes")
# dcgm-exporter's last XID code per GPU (its field holds the code, not a count): how the XID
# alert tells a critical code (conventions.GPU_XID_CRITICAL) from the others on such clusters.
REC_GPU_DCGM_XID_ERRORS_LAST = Recorded("fsdpmon_gpu:dcgm_xid_errors:last")

RECORDED: tuple[Recorded, ...] = tuple(
    v for k, v in sorted(globals().items()) if k.startswith("REC_") and isinstance(v, Recorded))


def get(name: str) -> Metric:
    """The catalog entry for ``name``; KeyError names the metric when it is not catalogued."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the fsdpmon catalog") from None


def all_series_names() -> frozenset[str]:
    """Every sample name any catalogued metric can expose (for dashboard and rule checks)."""
    return frozenset(s for m in ALL for s in m.series_names())
