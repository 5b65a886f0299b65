"""Names shared across components: ports, port names, label names, environment variables.

The monitor, the exporter, the Kubernetes manifests and `fsdpmon top` must agree on these, so
they live in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import Enum

# Default ports. 9400 is dcgm-exporter's; we stay clear of it.
TRAINING_PORT = 9520
EXPORTER_PORT = 9521

# Kubernetes container port names (IANA service names: at most 15 characters).
TRAINING_PORT_NAME = "fsdpmon-train"
EXPORTER_PORT_NAME = "fsdpmon-node"

# Label names on training series. Prometheus adds `job` and `instance` itself, so the
# training job's identity is `job_name`.
JOB_LABEL = "job_name"
RANK_LABEL = "rank"
LOCAL_RANK_LABEL = "local_rank"
TRAINING_LABELS = (JOB_LABEL, RANK_LABEL, LOCAL_RANK_LABEL)

# Label names on GPU series, and the pod attribution labels added to GPU and process series.
GPU_LABELS = ("gpu", "uuid", "model", "node")
POD_LABELS = ("namespace", "pod", "container")

# The model name every simulated GPU reports, so simulated data can never pass for real.
SIMULATED_GPU_MODEL = "SIMULATED"

# Pod labels that identify training pods.
PYTORCHJOB_LABEL = "training.kubeflow.org/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
TRAINJOB_REPLICATED_JOB = "node"
EXPORTER_APP_LABEL = "app.kubernetes.io/name"
EXPORTER_APP_NAME = "fsdpmon-exporter"

# Stall bound (fsdpmon.monitor.stall_bound), drawn from the job's own history at the rank's
# position: no step for max(factor x median step time, floor); in warm-up and the first save the
# floor; a save 3 x the longest before it (never under the floor); inside a collective (the
# ranks that wait for a hung one) 3 x the longest wait seen, never under the wait floor. The
# rank's watchdog computes it and publishes it, counted from its last step
# (fsdpmon_train_stall_threshold_seconds); `top`, `diagnose` and the stall rules read that
# published value, so none of them holds a copy of these.
DEFAULT_STALL_FACTOR = 10.0
DEFAULT_STALL_FLOOR_SECONDS = 120.0
# Longer than a rank-0-only pause between steps (an export, a log upload) of 20 s, the issue's
# case; short enough that the page comes within a minute (docs/alerts.md adds it up).
DEFAULT_STALL_WAIT_FLOOR_SECONDS = 25.0
STALL_HISTORY_FACTOR = 3.0

# The page's path after the stall bound, term by term (docs/alerts.md adds them up; a test holds
# the doc to these). The PodMonitor scrapes the training pods this often: the culprit's
# evidence (collective, phase, unresponsive flag) is in Prometheus within one scrape of the hang,
# long before the bound runs out.
TRAINING_SCRAPE_INTERVAL_SECONDS = 10
# The culprit group (stall culprits and the stall alerts) is evaluated this often, whatever the
# server's global interval (kube-prometheus-stack's is 30 s): the first evaluation past the bound
# comes within one. At 2,048 ranks one evaluation must stay under 2 s (issue 49): 20 % of a core.
CULPRIT_RULES_INTERVAL_SECONDS = 10
# The stall alerts' `for`: two scrapes, so a rank that stepped just inside its bound does not
# page while one late or failed scrape keeps its new step time out.
STALL_FOR_SECONDS = 2 * TRAINING_SCRAPE_INTERVAL_SECONDS
# Alertmanager's wait before a new group's first notification. Critical causes (a hang, a lost
# rank or GPU) page within one evaluation of each other (one group, one batch), so a short wait
# batches them; warnings keep Alertmanager's 30 s, batching what several evaluations raise.
CRITICAL_GROUP_WAIT_SECONDS = 5
WARNING_GROUP_WAIT_SECONDS = 30
# A live process ticks its watchdog thread at least every second; one silent this long is
# stopped, or hung while holding the GIL: the rank that hangs, not one waiting for it. The
# monitor's unresponsive gauge and its catalog help text use it.
UNRESPONSIVE_AFTER_SECONDS = 5.0

# The pod's server (fsdpmon.monitor.podserver) leaves, freeing the port, when no rank of its
# directory has published (a heartbeat's watchdog tick) for this long, even though their pids
# still run (reused by other processes, or a pod whose every rank is frozen): long enough that
# a pod whose ranks all hang stays served while the stall alert (its floor plus its `for`)
# and the unresponsive one fire, short enough that no port is held for hours with nothing
# behind it. Ranks that come back start a new server within their retry period.
POD_SERVER_SILENCE_SECONDS = 5 * DEFAULT_STALL_FLOOR_SECONDS

# The phases a rank's progress evidence names (fsdpmon_train_phase's `phase` label): the
# monitor's own phase names, and "other" for anything else (between phases, a loop's own name).
CHECKPOINT_PHASE = "checkpoint"  # the phase a save is wrapped in (its own stall bound)
PROGRESS_PHASES = ("data", "forward", "backward", "optimizer", CHECKPOINT_PHASE, "other")
OTHER_PHASE = PROGRESS_PHASES[-1]

# Monitor configuration from the environment (FSDPMON_PORT, FSDPMON_JOB_NAME, ...).
ENV_PREFIX = "FSDPMON_"
# Where the generated alerts' runbook_url points (`python -m fsdpmon.dashboards`,
# `fsdpmon manifests`).
RUNBOOK_URL_ENV = "FSDPMON_RUNBOOK_URL"


class Severity(str, Enum):
    """How urgent a finding is, in one word shared by the diagnosis findings (`diagnose`,
    `top`'s header and Diagnosis view) and the alert rules' ``severity`` label. A critical
    finding makes `fsdpmon diagnose` and `fsdpmon top --once` exit 4."""

    WARNING = "warning"
    CRITICAL = "critical"


# Diagnosis thresholds (`fsdpmon diagnose`, top's Diagnosis view, the alert rules): one
# definition each.
# A rank whose busy time (step time not spent waiting in collectives) is this share of the
# median rank's or less is a straggler: median busy / own busy < 0.75 (nvidia-resiliency-ext).
STRAGGLER_SCORE_THRESHOLD = 0.75


def below_straggler_line(score: float | None) -> bool:
    """Whether a score (the others' median busy, or held, time over a rank's own) says the
    others wait for the rank: below STRAGGLER_SCORE_THRESHOLD. No score, or NaN: no. The one
    comparison the judge's observations, goodput's split and top's SLOWEST mark all ask."""
    return score is not None and math.isfinite(score) and score < STRAGGLER_SCORE_THRESHOLD


# Device (or GPU) memory in use at or above this share of capacity is memory pressure.
MEMORY_PRESSURE_RATIO = 0.95
# A verdict needs its evidence in every sample spanning at least this long (never one sample);
# with top's 2 s refresh that is 6 samples, and it stays under the 30 s the hang target allows.
DIAGNOSIS_EVIDENCE_SECONDS = 10.0
# collective_desync at two ranks, where no majority tells the odd rank: a rank's step breaks
# its own pattern when it differs from what it made in this many earlier steps (all alike).
DESYNC_PATTERN_STEPS = 2
# A straggler's excess busy time is put down to data loading (or checkpointing) when at least
# this share of it is extra data wait (or checkpoint time) compared to the median rank.
STRAGGLER_CAUSE_SHARE = 0.5
# Job loss above this multiple of its recent median (sustained) is a loss spike (diagnose: a
# jump within minutes).
LOSS_SPIKE_FACTOR = 2.0
# The "recent" of that median: the job losses of this many seconds before the evidence window.
# Not the whole run: on a falling loss curve the first, high losses would hide a spike (issue
# 51). A median over 110 s keeps the level before a spike while the spike lasts under about
# half of it (55 s, hundreds of steps of a fast job); a level held longer is the new level, and
# a slow climb is FsdpmonLossDiverging's. 110 s with the 10 s window is the 2 minutes a live
# view's snapshot history keeps (diagnose/history.py): a longer reach would cost that history
# (of every rank and GPU) in memory, at 2,048 ranks hundreds of MB more.
LOSS_SPIKE_BASELINE_SECONDS = 110.0
# The job's gradient norm above this multiple of its recent level (its median over the same
# LOSS_SPIKE_BASELINE_SECONDS before the window) throughout the window is training_unstable.
# A healthy run's norm falls through warm-up and rises slowly as the learning rate decays: far
# from tripling within minutes. A run going unstable jumps by ~10x (issue 51: 0.9 -> 7-19).
UNSTABLE_GRAD_NORM_FACTOR = 3.0
# Job loss averaged over 10 minutes above this multiple of its lowest such average in the last
# hour is diverging (FsdpmonLossDiverging, cause loss_spike too): a slow climb, which averages
# over minutes make visible where a step's loss is noise, so a lower factor than a spike's.
LOSS_DIVERGENCE_FACTOR = 1.5
# Checkpoint time above this share of the step time (job median) is a slow checkpoint.
CHECKPOINT_SHARE_LIMIT = 0.25
# A node's CPUs busy at or above this share, under a straggling rank, is host CPU contention.
HOST_CPU_BUSY_RATIO = 0.95
# A rank the others wait for whose cgroup was throttled in at least this share of its CFS
# periods (its pod's CPU limit) is cpu_throttled; kube-prometheus's CPUThrottlingHigh pages at
# the same share of cAdvisor's container_cpu_cfs_throttled_periods_total.
CPU_THROTTLED_RATIO = 0.25
# Alert-only thresholds (no diagnosis rule of their own yet), one definition each all the same:
# a node's GPUs averaging below this utilisation while a rank runs there (FsdpmonGPULowUtilization);
GPU_LOW_UTILIZATION_RATIO = 0.30
# a GPU held down by a throttle reason this share of the time (FsdpmonGPUThrottling: NVML's
# accumulated clock-event time, as a flag sampled per scrape misses throttling that comes and goes);
GPU_THROTTLED_TIME_SHARE = 0.25
# a job's tokens/s below this share of its own recent average (FsdpmonThroughputDropped).
THROUGHPUT_DROP_RATIO = 0.6
# Incidents (`fsdpmon incidents`, from the run's files or from Prometheus history) are the
# judge's findings replayed over the run and merged into spans. Findings of one cause and rank
# this many log steps apart (files) or query steps apart (Prometheus: a missed scrape or two)
# are one incident; a stall's flags split alike.
# The replayed judge looks at most once this often (a live view refreshes every 2 s by default:
# no coarser than it), however short the log steps, so a long run of fast steps costs its wall
# time, not its step count.
REPLAY_INTERVAL_SECONDS = 1.0
INCIDENT_MERGE_GAP_STEPS = 2
INCIDENT_MERGE_GAP_QUERY_STEPS = 3
# A straggling stretch or a run of slow saves that cost less than this is noise, no incident.
INCIDENT_MIN_LOST_SECONDS = 1.0
# A rank that saw a stall this much later than its threshold past the last progress was not
# running Python meanwhile (the watchdog ticks at least once a second; one more for a loaded
# host): stopped, or holding the GIL (the files' rank_unresponsive).
STALL_SEEN_LATE_SECONDS = 2.0
# Right after a slow save, a save still this many times the run's fastest is the same fault
# (its share of the time can drop when a stall or a restart lengthened the time before it).
SLOW_SAVE_FACTOR = 2.0
# Restarts within the history that make a crash loop (one restart is a recovered crash).
CRASH_LOOP_RESTARTS = 2
# How a rank's previous incarnation ended (the `how` label of fsdpmon_train_previous_exit), as
# its process restarted by the elastic agent found it: killed (no word left: SIGKILL, the OOM
# killer, a segfault), sigterm (stopped by a signal: the agent stopping the group), error (a
# Python exception), exit (it finished).
EXIT_KILLED, EXIT_SIGTERM, EXIT_ERROR, EXIT_NORMAL = "killed", "sigterm", "error", "exit"
EXIT_HOWS = (EXIT_KILLED, EXIT_SIGTERM, EXIT_ERROR, EXIT_NORMAL)
# A restarted rank's report that its previous incarnation died names it for this long after the
# restart: as long as the diagnosis history keeps a restart counter's rise in view.
CRASH_EVIDENCE_SECONDS = 12 * DIAGNOSIS_EVIDENCE_SECONDS
# NVML's clock-event (throttle) reason bits (nvmlClocksEventReason*) -> the reason's name: the
# `reason` label of the per-reason series, and how a reader decodes the bitmask series.
GPU_CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def clock_event_mask(active: Iterable[str]) -> float:
    """NVML's bitmask of the clock-event reasons named in ``active`` (unknown names add
    nothing, a name given twice counts once), as the exporter serves it."""
    return float(sum(GPU_CLOCK_EVENT_BITS.get(reason, 0) for reason in set(active)))
# Clock-event reasons that mean a GPU runs slower than it should (NVML clock event reasons).
# sw_power_cap is also active on healthy GPUs at full load, so it counts only on a straggler.
GPU_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
                        "sw_thermal_slowdown")
GPU_POWER_CAP_REASON = "sw_power_cap"
# XID codes that mean the GPU or its node must be drained (NVIDIA's XID catalogue: 79 fell
# off the bus, 48/63/64/94/95 memory, 74 NVLink, 92 high single-bit ECC, 119/120 GSP).
GPU_XID_CRITICAL = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)

# How urgent each cause is: one table that the diagnosis' findings and the alert rules'
# `severity` label both read (tests/test_rules_conventions.py fails on a generated rule that
# differs). Three causes depend on what raised them, each through its own table below: an XID
# by its code, throttling by its clock-event reason, a target that is down by its kind.
CAUSE_SEVERITY = {
    "collective_desync": Severity.CRITICAL,  # the job hangs, or trains on mismatched data
    "hang": Severity.CRITICAL,
    "rank_unresponsive": Severity.CRITICAL,
    "rank_missing": Severity.CRITICAL,
    "crash_loop": Severity.CRITICAL,
    "gpu_lost": Severity.CRITICAL,
    "gpu_xid": Severity.WARNING,  # the codes outside GPU_XID_CRITICAL (13, 31, 43: often the app)
    "gpu_ecc": Severity.CRITICAL,
    "loss_nonfinite": Severity.CRITICAL,
    "gpu_throttled": Severity.WARNING,
    "straggler_compute": Severity.WARNING,
    "straggler_data": Severity.WARNING,
    "host_cpu_contention": Severity.WARNING,
    "cpu_throttled": Severity.WARNING,
    "checkpoint_slow": Severity.WARNING,
    "memory_pressure": Severity.WARNING,
    "loss_spike": Severity.WARNING,
    "training_unstable": Severity.WARNING,  # a warning before a spike or a NaN, if any comes
    "target_down": Severity.CRITICAL,  # a target never read: it may be a training one
}
# A clock-event reason's severity (the throttle reasons, and power capping on a straggler).
THROTTLE_SEVERITY = {reason: Severity.WARNING
                     for reason in (*GPU_THROTTLE_REASONS, GPU_POWER_CAP_REASON)}
# A target that is down, by its kind: a training endpoint (its ranks unseen, the job may be
# dead) or a node's exporter (its GPUs unseen, training goes on).
TARGET_DOWN_SEVERITY = {"train": Severity.CRITICAL, "exporter": Severity.WARNING}


def xid_severity(code: int | str) -> Severity:
    """An XID's severity: critical for the GPU_XID_CRITICAL codes, else gpu_xid's."""
    text = str(code).strip()
    critical = text.isdigit() and int(text) in GPU_XID_CRITICAL
    return Severity.CRITICAL if critical else CAUSE_SEVERITY["gpu_xid"]


def cause_severity(cause: str, detail: int | str | None = None) -> Severity:
    """The severity of a finding or alert of ``cause``; ``detail``: the XID code (gpu_xid), the
    clock-event reason (gpu_throttled) or the target's kind (target_down), where known.
    KeyError for a cause the table lacks."""
    if detail is not None and cause == "gpu_xid":
        return xid_severity(detail)
    if detail is not None and cause == "gpu_throttled" and detail in THROTTLE_SEVERITY:
        return THROTTLE_SEVERITY[str(detail)]
    if detail is not None and cause == "target_down" and detail in TARGET_DOWN_SEVERITY:
        return TARGET_DOWN_SEVERITY[str(detail)]
    return CAUSE_SEVERITY[cause]


def cause_severities(cause: str) -> set[Severity]:
    """Every severity a finding of ``cause`` may have (one, but for those with details)."""
    extra = {"gpu_xid": {xid_severity(code) for code in GPU_XID_CRITICAL},
             "gpu_throttled": set(THROTTLE_SEVERITY.values()),
             "target_down": set(TARGET_DOWN_SEVERITY.values())}.get(cause, set())
    return {CAUSE_SEVERITY[cause], *extra}


# ---- collectives, as the monitor numbers and publishes them and diagnosis reads them ----
# The blocking c10d entry points (each also under torch.distributed.distributed_c10d), numbered
# and timed. send/recv too: a rank blocked in a point-to-point call waits for its peer.
C10D_NAMES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all",
    "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
    "broadcast", "reduce", "barrier", "gather", "scatter", "all_gather_object",
    "broadcast_object_list", "send", "recv",
)
# Called by DDP (its buffers before each forward, its module states at construction) and by
# FSDP1's state sync: a blocking C++ binding, but reached through the torch.distributed module
# attribute, so it can be numbered and timed like the others (entry point -> op name).
PRIVATE_NAMES = {"_broadcast_coalesced": "broadcast_coalesced"}
# Published as numbers (no free text in a series): an op's code is its index here + 1, a
# dtype's likewise (0: none or unknown). Append only: a reader decodes a writer's codes.
OPS = (*C10D_NAMES, *PRIVATE_NAMES.values())
DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8",
               "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")
OP_CODES = {op: code for code, op in enumerate(OPS, 1)}
DTYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPE_NAMES, 1)}


def decoded(names: tuple[str, ...], code: int | None) -> str | None:
    """The name a published code stands for in ``names`` (OPS or DTYPE_NAMES); None: 0 or
    unknown (a newer writer's code)."""
    return names[code - 1] if code is not None and 0 < code <= len(names) else None


# Calls whose size differs by rank where nothing is wrong (an all-to-all's splits: MoE token
# routing): their key leaves the size out. Point-to-point calls differ by rank by design (a
# pipeline's stages): they are numbered, not fingerprinted.
UNEVEN = frozenset(("all_to_all", "all_to_all_single"))
POINT_TO_POINT = frozenset(("send", "recv"))
# Where each op takes its process group when passed by position (torch's signatures, checked
# by the tests); else it is ``group=``. The fingerprint keys each call by its group.
GROUP_AT = {
    "all_reduce": 2, "all_gather": 2, "all_gather_into_tensor": 2, "all_gather_single": 2,
    "all_to_all": 2, "all_to_all_single": 4, "reduce_scatter": 3, "reduce_scatter_tensor": 3,
    "reduce_scatter_single": 3, "broadcast": 2, "reduce": 3, "barrier": 0, "gather": 3,
    "scatter": 3, "all_gather_object": 2, "broadcast_object_list": 2, "send": 2, "recv": 2,
    "broadcast_coalesced": 0,  # torch.distributed._broadcast_coalesced(process_group, ...)
}
