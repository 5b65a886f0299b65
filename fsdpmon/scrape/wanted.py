"""The series `top` reads: catalog name → the field it fills, grouped by the row it lands in.

Every name comes from the catalog (looked up at import, so a rename fails loudly here). Sources
pass WANTED to the parser (and ask targets for it with ``name[]``) so that other series are never
built; REQUIRE narrows a few names to the one label value top shows.
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.scrape.expfmt import Parser

# Per-rank figures: catalog name → accumulator key.
RANK_METRICS = {
    catalog.TRAIN_STEP.name: "step",
    catalog.TRAIN_TOTAL_STEPS.name: "total_steps",
    catalog.TRAIN_STEP_TIME_SECONDS.name: "step_time_s",
    catalog.TRAIN_DATA_WAIT_RATIO.name: "data_wait_ratio",
    catalog.TRAIN_TOKENS_PER_SECOND.name: "tokens_per_second",
    catalog.TRAIN_MFU_RATIO.name: "mfu_ratio",
    catalog.TRAIN_LOSS.name: "loss",
    catalog.TRAIN_GRAD_NORM.name: "grad_norm",
    catalog.TRAIN_LOSS_NONFINITE.name: "loss_nonfinite",
    catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP.name: "loss_first_nonfinite_step",
    catalog.TRAIN_GRAD_NORM_FIRST_NONFINITE_STEP.name: "grad_norm_first_nonfinite_step",
    catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES.name: "peak_memory_bytes",
    catalog.TRAIN_PROCESS_RSS_BYTES.name: "rss_bytes",
    catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES.name: "memory_capacity_bytes",
    catalog.TRAIN_HEARTBEAT_AGE_SECONDS.name: "heartbeat_age_s",
    catalog.TRAIN_STALL_THRESHOLD_SECONDS.name: "stall_threshold_s",
    catalog.TRAIN_STALLED.name: "stalled",
    catalog.TRAIN_RESTARTS.name: "restarts",
    catalog.TRAIN_PREVIOUS_EXIT_STEP.name: "previous_exit_step",
    catalog.TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS.name: "previous_exit_unix",
    catalog.TRAIN_BUSY_SECONDS.name: "busy_s",
    catalog.TRAIN_COLLECTIVE_WAIT_RATIO.name: "collective_wait_ratio",
    catalog.TRAIN_STRAGGLER_SCORE.name: "straggler_score",
    catalog.TRAIN_STRAGGLING.name: "straggling",
    catalog.TRAIN_WAITED_FOR_SCORE.name: "waited_for_score",
    catalog.TRAIN_DESCHEDULED_RATIO.name: "descheduled_ratio",
    catalog.TRAIN_CPU_THROTTLED_RATIO.name: "cpu_throttled_ratio",
    catalog.TRAIN_UNRESPONSIVE.name: "unresponsive",
    catalog.TRAIN_COLLECTIVE_ENTERED_SEQ.name: "collective_entered",
    catalog.TRAIN_IN_COLLECTIVE.name: "in_collective",
    catalog.TRAIN_STEP_COLLECTIVE_CALLS.name: "step_collectives",
    catalog.TRAIN_STEP_COLLECTIVE_FINGERPRINT.name: "step_fingerprint",
    catalog.TRAIN_STEP_COLLECTIVE_END_SEQ.name: "step_end_seq",
    catalog.TRAIN_COLLECTIVE_ENTERED_OP.name: "entered_op",
    catalog.TRAIN_COLLECTIVE_ENTERED_ELEMENTS.name: "entered_elements",
    catalog.TRAIN_COLLECTIVE_ENTERED_DTYPE.name: "entered_dtype",
    catalog.TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN.name: "entered_off_pattern",
    catalog.TRAIN_COLLECTIVE_BREAK_STEP.name: "break_step",
    catalog.TRAIN_COLLECTIVE_BREAK_INDEX.name: "break_index",
    catalog.TRAIN_COLLECTIVE_BREAK_OP.name: "break_op",
    catalog.TRAIN_COLLECTIVE_BREAK_ELEMENTS.name: "break_elements",
    catalog.TRAIN_COLLECTIVE_BREAK_DTYPE.name: "break_dtype",
    catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_OP.name: "break_expected_op",
    catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_ELEMENTS.name: "break_expected_elements",
    catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_DTYPE.name: "break_expected_dtype",
    catalog.TRAIN_CHECKPOINT_SECONDS.name: "checkpoint_seconds",
    catalog.TRAIN_CHECKPOINT_OWN_SECONDS.name: "checkpoint_own_seconds",
    catalog.TRAIN_CHECKPOINT_TIME_RATIO.name: "checkpoint_time_ratio",
    catalog.TRAIN_GOODPUT_RATIO.name: "goodput_ratio",  # rank 0's, for the job
}
TRAIN_INFO = catalog.TRAIN_INFO.name
# How a restarted rank's previous incarnation ended: the `how` label of its one series.
PREVIOUS_EXIT = catalog.TRAIN_PREVIOUS_EXIT.name
# The call site of a rank's last collective pattern break: the `site` label of its one series.
BREAK_SITE = catalog.TRAIN_COLLECTIVE_BREAK_SITE_INFO.name
# The rank fields filled from a label of a name's one series: name -> (field, label).
RANK_LABELLED = {PREVIOUS_EXIT: ("previous_exit", "how"), BREAK_SITE: ("break_site", "site")}
JOB_METRICS = {
    catalog.JOB_STEP_TIME_MEDIAN_SECONDS.name: "step_time_median_s",
    catalog.JOB_STEP_TIME_MAX_SECONDS.name: "step_time_max_s",
    catalog.JOB_SLOWEST_RANK.name: "slowest_rank",
    catalog.JOB_LOSS_MEAN.name: "loss",
    catalog.JOB_WORLD_SIZE.name: "world_size",
}
GPU_METRICS = {
    catalog.GPU_UP.name: "up",
    catalog.GPU_UTILIZATION_RATIO.name: "utilization_ratio",
    catalog.GPU_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.GPU_MEMORY_TOTAL_BYTES.name: "memory_total_bytes",
    catalog.GPU_TEMPERATURE_CELSIUS.name: "temperature_celsius",
    catalog.GPU_POWER_WATTS.name: "power_watts",
    catalog.GPU_POWER_LIMIT_WATTS.name: "power_limit_watts",
}
GPU_PROCESS_MEMORY = catalog.GPU_PROCESS_MEMORY_USED_BYTES.name
# GPU fault evidence: the active clock-event reasons as one bitmask per GPU (not the nine
# per-reason series, eight of them 0), one series per XID code and per ECC type.
GPU_CLOCK_EVENT = catalog.GPU_CLOCK_EVENT_REASONS.name
GPU_XID = catalog.GPU_XID_ERRORS_TOTAL.name
GPU_ECC = catalog.GPU_ECC_ERRORS_TOTAL.name
GPU_EVENTS = frozenset([GPU_CLOCK_EVENT, GPU_XID, GPU_ECC])
EXPORTER_INFO = catalog.EXPORTER_INFO.name
HOST_METRICS = {
    catalog.HOST_MEMORY_USED_BYTES.name: "memory_used_bytes",
    catalog.HOST_MEMORY_TOTAL_BYTES.name: "memory_total_bytes",
    catalog.HOST_LOAD1.name: "load1",
}
HOST_CPU = catalog.HOST_CPU_UTILIZATION_RATIO.name
PROCESS_INFO = catalog.PROCESS_INFO.name
PROCESS_STATE = catalog.PROCESS_STATE.name
PROCESS_METRICS = {
    catalog.PROCESS_CPU_UTILIZATION_RATIO.name: "cpu_ratio",
    catalog.PROCESS_RESIDENT_MEMORY_BYTES.name: "rss_bytes",
}

# Everything top reads; sources pass it to the parser so that other series are never built.
WANTED: frozenset[str] = frozenset(
    [*RANK_METRICS, TRAIN_INFO, *RANK_LABELLED, *JOB_METRICS, *GPU_METRICS, GPU_PROCESS_MEMORY,
     EXPORTER_INFO, *GPU_EVENTS,
     *HOST_METRICS, HOST_CPU, PROCESS_INFO, PROCESS_STATE, *PROCESS_METRICS]
)


# Text a line of these names must hold to be read; the parser's scan skips the others. Of the
# ECC counts top shows the uncorrected; of the host CPU series the node total (the exporter
# serves the cores under their own name; a target that does not is read as cheaply).
REQUIRE = {HOST_CPU: 'cpu="all"', GPU_ECC: 'type="uncorrected"'}


def new_parser() -> Parser:
    """The parser every source uses: only what top reads (its label cache lives with it)."""
    return Parser(WANTED, REQUIRE)

