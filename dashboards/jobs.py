"""The job-level dashboards: one job's overview (throughput, progress, diagnosis, quality and
health) and runs compared (throughput and memory per GPU against world size, across jobs).

Job-level figures are the recorded names of :mod:`fsdpmon.dashboards.rules`, read by their
:class:`fsdpmon.catalog.Recorded` symbols through :func:`fsdpmon.dashboards.promql.m`.
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.catalog import Metric, Recorded
from fsdpmon.conventions import GPU_THROTTLE_REASONS, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.dashboards.panels import (
    Json,
    Panel,
    Row,
    Target,
    bars,
    dashboard,
    stat,
    table,
    timeseries,
)
from fsdpmon.dashboards.promql import JOB_KEYS, m
from fsdpmon.dashboards.scope import JOB, NODE_ALL, PER_JOB, PER_RANK, RANGE, RATE, links, variables


def _job(recorded: Recorded, legend: str = PER_JOB) -> Target:
    """A job-level recorded figure for the selected jobs."""
    return Target(m(recorded, JOB), legend)


def _job_max(metric: Metric) -> Target:
    return Target(f"max by ({JOB_KEYS}) ({m(metric, JOB)})", PER_JOB)


CULPRIT_LABELS = "cause, rank, pod, node, gpu"


def _culprit_now() -> Panel:
    """What is wrong now and where: each firing alert's cause and culprit (rank, pod, node,
    GPU) with how long it has held (since it went pending), and a stall's culprit as soon as
    the culprit rules name it, before its alert's `for` has passed."""
    held = (f"(time() - ALERTS_FOR_STATE{{{JOB}}})\n"
            f"  and ignoring (alertstate) ALERTS{{alertstate=\"firing\", {JOB}}}")
    stall = m(catalog.REC_RANK_STALL_CULPRIT_SECONDS, JOB)
    expr = (f"max by ({CULPRIT_LABELS}) (\n  {held}\n)\nor\n"
            f"max by ({CULPRIT_LABELS}) ({stall})")
    return table("Culprit now", Target(expr), unit="s", width=24, height=5,
                 description="What is wrong now and where, from the culprit rules and the "
                             "firing alerts: the cause (the runbook's section), the culprit's "
                             "rank, pod, node and GPU, and how long it has held. A stalled "
                             "job shows the rank the others wait for, never a rank that only "
                             "waits; empty while nothing is wrong.")


def _job_now() -> list[Panel | Row]:
    stalled = m(catalog.TRAIN_STALLED, JOB)
    return [
        Row("Now"),
        _culprit_now(),
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


def _job_goodput() -> list[Panel | Row]:
    """Where the wall-clock time went, from the goodput counters rank 0 serves (docs/goodput.md):
    recomputed steps were counted productive when first made, so they come off it."""
    productive = m(catalog.TRAIN_PRODUCTIVE_SECONDS_TOTAL, JOB)
    badput = m(catalog.TRAIN_BADPUT_SECONDS_TOTAL, JOB)
    made = f"sum by ({JOB_KEYS}) (increase({productive}[{RANGE}]))"
    recompute = m(catalog.TRAIN_BADPUT_SECONDS_TOTAL, f'{JOB}, cause="recompute"')
    redone = f"(sum by ({JOB_KEYS}) (increase({recompute}[{RANGE}])) or {made} * 0)"
    lost = f"(sum by ({JOB_KEYS}) (increase({badput}[{RANGE}])) or {made} * 0)"
    good = f"({made} - {redone}) / ({made} + {lost} - {redone})"
    return [
        Row("Goodput"),
        stat("Goodput (time range)", Target(good, PER_JOB), unit="percentunit", width=6,
             height=8, description="Share of the wall-clock time spent making steps that were "
                                   "kept, over the dashboard's time range (fsdpmon goodput "
                                   "gives the same split from a run's files)."),
        timeseries("Badput by cause", Target(
            f"sum by ({JOB_KEYS}, cause) (rate({badput}[{RATE}]))", "{{job_name}} {{cause}}"),
            Target(f"sum by ({JOB_KEYS}) (rate({productive}[{RATE}]))",
                   "{{job_name}} productive"), unit="percentunit", min=0, stack=True, width=18,
            description="Share of wall-clock time per cause (startup, data_wait, "
                        "checkpoint_save, checkpoint_restore, restart, recompute, stall, "
                        "straggler_wait) stacked on the productive share; `fsdpmon "
                        "incidents` names the rank and node behind each."),
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
    items = [*_job_now(), *_job_speed(), *_job_goodput(), *_job_diagnosis(),
             *_job_quality_and_health()]
    return dashboard("fsdpmon-job", "fsdpmon / Job overview",
                     "Throughput, speed, progress, quality and health of FSDP training jobs.",
                     items, variables("namespace", "job"), links("namespace", "job"))


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
                     "chart of the EKS workflow, live.", items, variables("namespace", "job"),
                     links("namespace", "job"))
