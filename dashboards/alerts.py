"""Alerting rules for FSDP jobs: training (stalls, missing ranks, stragglers, loss, memory,
checkpoints) and scrape targets; the GPUs' are in dashboards/gpu_alerts.py. Every threshold and
``for`` is a field of :class:`fsdpmon.dashboards.rulebase.RuleBounds`; every alert names its
diagnosis cause."""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.conventions import CRASH_EVIDENCE_SECONDS
from fsdpmon.dashboards.promql import JOB_KEYS, RANK_KEYS, m
from fsdpmon.dashboards.rulebase import (
    AGE,
    SCORE_LINE,
    STEP_TIME,
    Rule,
    RuleBounds,
    alert,
    rank_line,
    rose,
)

# Go template: the straggler line the alert's rank publishes, in its description.
LINE = rank_line()


def _rank_missing(b: RuleBounds) -> Rule:
    keys = "instance, job, namespace, pod, job_name, rank"
    step, total = m(catalog.TRAIN_STEP), m(catalog.TRAIN_TOTAL_STEPS)
    lb = b.missing_lookback
    seen = f"group by ({keys}) (max_over_time({AGE}[{lb}]))"
    finished = (f"(max_over_time({step}[{lb}]) >= max_over_time({total}[{lb}]))")
    missing = (f"({seen}\n    unless on (instance, job_name, rank) {AGE}\n"
               f"    unless on (instance, job_name, rank) {finished})")
    live_pod = ('(kube_pod_info unless on (namespace, pod) '
                '(kube_pod_status_phase{phase=~"Succeeded|Failed"} == 1))')
    expr = (f"({missing}\n  and on (instance, job) (up == 1))\nor\n"
            f"({missing}\n  and on (namespace, pod) {live_pod})")
    return alert(
        "FsdpmonTrainingRankMissing", expr, b.missing_for,
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} stopped reporting while its pod "
        "still exists",
        "The training series of rank {{ $labels.rank }} {{ if $labels.pod }}(pod "
        "{{ $labels.namespace }}/{{ $labels.pod }}) {{ end }}vanished from "
        "{{ $labels.instance }} before its last step, although its pod still runs or the "
        "endpoint still serves the other ranks.",
        "The rank's process died or hung so hard it cannot be scraped: check the pod's "
        "container restarts and logs (OOMKilled, segfault, NCCL error) and `dmesg` for XIDs.",
    )


def _straggling() -> str:
    # Step time cannot name a straggler (in synchronous training every rank's step is as long
    # as the slowest one's); the score does: the straggler is the rank that waits least at the
    # collectives, i.e. is busy longest. And only while the monitor flags it
    # (fsdpmon_train_straggling): a score below the line in two busy-time medians over disjoint
    # steps. One noisy median on a healthy job (a loaded host) would otherwise set the alert
    # pending every few minutes.
    score = m(catalog.TRAIN_STRAGGLER_SCORE)
    flag = m(catalog.TRAIN_STRAGGLING)
    return f"{score} < {SCORE_LINE} and {flag} == 1"


def _on_data(b: RuleBounds) -> str:
    """Stragglers whose extra busy time is mostly extra data wait (STRAGGLER_CAUSE_SHARE of it
    or more), against the job's median rank, as `fsdpmon diagnose` splits them (it takes the
    other ranks' median: on 2 ranks both sides of the comparison are then exactly half of
    diagnose's, so the verdict is the same; on more, the median moves by at most one rank)."""
    busy = m(catalog.TRAIN_BUSY_SECONDS)
    data = f"({m(catalog.TRAIN_DATA_WAIT_RATIO)} * {STEP_TIME})"
    median = f"on ({JOB_KEYS}) group_left quantile by ({JOB_KEYS}) (0.5, {{}})"
    excess = f"({busy} - {median.format(busy)})"
    extra = f"({data} - {median.format(data)})"
    return (f"({_straggling()})\n  and on ({RANK_KEYS}) ({excess} > 0)\n"
            f"  and on ({RANK_KEYS}) ({extra} >= {b.straggler_cause_share:g} * {excess})")


def _straggler(b: RuleBounds) -> Rule:
    return alert(
        "FsdpmonRankStraggling",
        f"{_straggling()}\nunless on ({RANK_KEYS}) (\n{_on_data(b)}\n)",
        b.straggler_for,
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} is straggling",
        "Rank {{ $labels.rank }} has straggler score {{ $value | printf \"%.2f\" }} (the other "
        "ranks' median busy time over its own; below " + LINE + "): it waits least "
        "at the collectives, and every other rank waits for it at each one.",
        "Compare the rank's phases on the Ranks dashboard: slow forward/backward points at a "
        "throttled or faulty GPU (see the Nodes dashboard for its clocks, temperature and "
        "XIDs) or a noisy neighbour on the node.",
    )


def _straggler_on_data(b: RuleBounds) -> Rule:
    return alert(
        "FsdpmonRankStragglingOnData", _on_data(b), b.straggler_for,
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} is straggling: it waits for its data",
        "Rank {{ $labels.rank }} has straggler score {{ $value | printf \"%.2f\" }} (below "
        + LINE + "), and most of its extra busy time is waiting for its data "
        "loader: every other rank waits for it at each collective.",
        "Check the rank's data loader workers, its dataset storage (FSx/S3) throughput and "
        "its pod's CPU limit.",
    )


def _ranks_short(b: RuleBounds) -> Rule:
    """Ranks that never reported are not caught by the rule above (nothing vanished): e.g. a
    pod whose endpoint another job took, or a pod that never started."""
    by = f"by ({JOB_KEYS})"
    # A rank that vanished is FsdpmonTrainingRankMissing's (which names it): this one stays
    # quiet while that one is pending or firing for the job, instead of paging twice.
    expr = (f"(max {by} ({m(catalog.JOB_WORLD_SIZE)})\n"
            f"  > count {by} ({AGE}))\n"
            f"unless on ({JOB_KEYS}) ALERTS{{alertname=\"FsdpmonTrainingRankMissing\"}}")
    return alert(
        "FsdpmonTrainingRanksShort", expr, b.missing_for,
        "Fewer ranks of {{ $labels.job_name }} report than its world size",
        "The job has {{ $value }} ranks, but fewer of them are scraped: a pod's endpoint is "
        "not scraped, serves another job, or the pod never started.",
        "List the ranks that report (`fsdpmon top --job NAME` names the ones never seen), "
        "then check the missing ranks' pods: Pending, crash-looping, or their metrics port "
        "taken by another process (the trainer's log says so at start).",
    )


def _checkpoint_holdup(b: RuleBounds) -> str:
    """The rank the others waited for in the last save (one per job, the largest excess): its
    own save work (not waiting for peers) above the other ranks' by STRAGGLER_CAUSE_SHARE of
    the save's wall time or more, as `fsdpmon diagnose` names it. The others' mean, where
    diagnose takes their median: the same on 2 ranks (one other), and on more the same while
    one rank holds the others up (they then agree with each other)."""
    own = m(catalog.TRAIN_CHECKPOINT_OWN_SECONDS)
    wall = m(catalog.TRAIN_CHECKPOINT_SECONDS)
    others = (f"((sum by ({JOB_KEYS}) ({own}) - on ({JOB_KEYS}) group_right {own})\n"
              f"    / on ({JOB_KEYS}) group_left () (count by ({JOB_KEYS}) ({own}) - 1 > 0))")
    return (f"topk by ({JOB_KEYS}) (1,\n  {own} - {others}\n"
            f"  >= {b.straggler_cause_share:g} * {wall})")


def _checkpoint_slow(b: RuleBounds) -> Rule:
    # The median rank's last save against the time since the save before it (the monitor
    # serves both until the next save): the same share `fsdpmon diagnose` holds to the same
    # limit, and it names the rank the others waited for.
    share = m(catalog.TRAIN_CHECKPOINT_TIME_RATIO)
    slow = f"(quantile by ({JOB_KEYS}) (0.5, {share}) >= {b.checkpoint_share:g})"
    holdup = _checkpoint_holdup(b)
    expr = (f"{slow}\n  + on ({JOB_KEYS}) group_left (rank, local_rank, pod, node, instance)\n"
            f"  (0 * {holdup})\nor\n{slow} unless on ({JOB_KEYS}) {holdup}")
    return alert(
        "FsdpmonCheckpointSlow", expr,
        b.checkpoint_for,
        "Checkpointing takes {{ $value | humanizePercentage }} of {{ $labels.job_name }}'s time",
        "The median rank's last checkpoint save took {{ $value | humanizePercentage }} of the "
        f"wall time since the save before it (limit {b.checkpoint_share:.0%}): that share of "
        "the GPUs' time goes to writing checkpoints, not training.",
        "Run `fsdpmon diagnose` to name the rank whose save the others waited for, then check "
        "the storage it writes to (FSx/EBS throughput, throttling) or save less often.",
    )


def _cpu_throttled(b: RuleBounds) -> Rule:
    # A CPU limit that throttles a rank matters when the others wait for it: the cgroup's
    # throttled share of CFS periods (averaged: one log window holds few periods) and the
    # rank's waited-for score below the straggler line, as `fsdpmon diagnose` holds them.
    share = m(catalog.TRAIN_CPU_THROTTLED_RATIO)
    waited = m(catalog.TRAIN_WAITED_FOR_SCORE)
    return alert(
        "FsdpmonRankCpuThrottled",
        f"avg_over_time({share}[{b.cpu_throttled_window}]) >= {b.cpu_throttled_share:g}\n"
        f"  and on ({JOB_KEYS}, rank) {waited} < {SCORE_LINE}",
        b.cpu_throttled_for,
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} is held back by its CPU limit",
        "The cgroup of rank {{ $labels.rank }} (its pod's CPU limit) was throttled in "
        "{{ $value | humanizePercentage }} of its CFS periods, and the other ranks wait for "
        "it at every collective (its waited-for score is below "
        + LINE + ").",
        "Raise the pod's CPU limit or drop it and keep the request; fewer data loader workers "
        "and tokeniser threads in the pod. `kubectl top pod --containers` shows the use.",
    )


def _cpu_starved(b: RuleBounds) -> Rule:
    # As `fsdpmon diagnose` tells a rank starved of CPU from a straggler (diagnose/observe.py):
    # the others wait for it (waited-for score below the line) but it is no busier than they
    # are (straggler score not below it), and it waits for a CPU more than the job's median
    # rank (on 2 ranks: more than the other one, as diagnose); not its own CPU limit (that is
    # FsdpmonRankCpuThrottled's).
    waited = m(catalog.TRAIN_WAITED_FOR_SCORE)
    score = m(catalog.TRAIN_STRAGGLER_SCORE)
    desched = m(catalog.TRAIN_DESCHEDULED_RATIO)
    share = m(catalog.TRAIN_CPU_THROTTLED_RATIO)
    return alert(
        "FsdpmonRankCpuStarved",
        f"{waited} < {SCORE_LINE}\n"
        f"  unless on ({RANK_KEYS}) ({score} < {SCORE_LINE})\n"
        f"  and on ({RANK_KEYS}) ({desched}\n"
        f"    > on ({JOB_KEYS}) group_left quantile by ({JOB_KEYS}) (0.5, {desched}))\n"
        f"  unless on ({RANK_KEYS}) (avg_over_time({share}[{b.cpu_throttled_window}])"
        f" >= {b.cpu_throttled_share:g})",
        b.cpu_starved_for,
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} is starved of CPU by other work on "
        "its node",
        "The other ranks wait for rank {{ $labels.rank }} at every collective (its waited-for "
        "score is {{ $value | printf \"%.2f\" }}, below " + LINE + "), yet "
        "its own work is no slower than theirs: its time goes to waiting for a CPU, more than "
        "the job's median rank.",
        "Give the pod a CPU request equal to its limit (Guaranteed QoS, static CPU manager), "
        "fewer data loader workers, or move other pods off the node.",
    )


def training_alerts(b: RuleBounds) -> list[Rule]:
    return [_rank_missing(b), _rank_died(), _ranks_short(b), _straggler(b),
            _straggler_on_data(b), _cpu_throttled(b), _cpu_starved(b),
            _checkpoint_slow(b), *_quality_alerts(b), *_memory_alerts(b)]


def _rank_died() -> Rule:
    # The rank's restarted process says how its previous life ended (the exit record): killed
    # (no word left: SIGKILL, the OOM killer, a segfault) or an error brought the group down,
    # and the agent restarted every rank; only that rank is named, for as long as `fsdpmon
    # diagnose` names it (CRASH_EVIDENCE_SECONDS after the restart).
    # As `fsdpmon diagnose` tells them (diagnose/exits.py): the ranks killed; else the one rank
    # that ended on an error while every other was stopped by the agent (SIGTERM). A rank that
    # failed because its peer was killed (a collective's connection reset) is not named.
    when = m(catalog.TRAIN_PREVIOUS_EXIT_TIMESTAMP_SECONDS)

    def ended(how: str) -> str:
        return (f"({m(catalog.TRAIN_PREVIOUS_EXIT, f'how={how!r}'.replace(chr(39), chr(34)))}"
                f" == 1\n  and on ({RANK_KEYS}) (time() - {when} < {CRASH_EVIDENCE_SECONDS:g}))")

    killed, error = ended("killed"), ended("error")
    expr = (f"{killed}\nor\n({error}\n  unless on ({JOB_KEYS}) {killed}\n"
            f"  and on ({JOB_KEYS}) (count by ({JOB_KEYS}) {error} == 1)\n"
            f"  and on ({JOB_KEYS}) {ended('sigterm')}\n  unless on ({JOB_KEYS}) {ended('exit')})")
    return alert(
        "FsdpmonRankDied", expr,
        "",
        "Rank {{ $labels.rank }} of {{ $labels.job_name }} died ({{ $labels.how }}) and the "
        "job restarted",
        "The previous life of rank {{ $labels.rank }}{{ if $labels.pod }} (pod "
        "{{ $labels.pod }}){{ end }} ended {{ $labels.how }}; the elastic agent restarted "
        "every rank, and only this one's end brought the group down.",
        "`kubectl logs POD --previous` for the exit (an OOM kill, a segfault, an exception); "
        "a second restart within minutes is a crash loop.",
    )


def _nonfinite_origin() -> str:
    """The ranks whose loss went non-finite first (the gradient reduce spreads a NaN to every
    rank's loss a step later: the others only caught it); every non-finite rank where no rank
    publishes the first step."""
    flag = m(catalog.TRAIN_LOSS_NONFINITE)
    first = m(catalog.TRAIN_LOSS_FIRST_NONFINITE_STEP)
    return (f"{flag} == 1\n  and on ({RANK_KEYS})\n"
            f"  ({first} == on ({JOB_KEYS}) group_left min by ({JOB_KEYS}) ({first}))\n"
            f"or\n({flag} == 1 unless on ({JOB_KEYS}) {first})")


def _quality_alerts(b: RuleBounds) -> list[Rule]:
    job_tps = m(catalog.REC_JOB_TOKENS_PER_SECOND_SUM)
    smooth = f"avg_over_time({m(catalog.REC_JOB_LOSS_AVG)}[{b.divergence_smoothing}])"
    return [
        alert(
            "FsdpmonLossNonFinite", _nonfinite_origin(),
            b.nonfinite_for,
            "Loss of {{ $labels.job_name }} is NaN or infinite on rank {{ $labels.rank }}",
            "The last logged loss of rank {{ $labels.rank }} was not finite, and it went "
            "non-finite first (the others caught it from this rank's gradients); the run is "
            "wasting compute from here on.",
            "Check the learning rate and warm-up, the grad norm just before (Job overview), "
            "mixed-precision settings and the batch that was loaded; resume from the last good "
            "checkpoint with a lower LR or skip the bad data.",
        ),
        alert(
            "FsdpmonLossDiverging",
            f"{smooth}\n  > {b.divergence_factor:g} * min_over_time({smooth}"
            f"[{b.divergence_window}:1m])",
            b.divergence_for,
            "Loss of {{ $labels.job_name }} is diverging",
            "The mean loss averaged over " + b.divergence_smoothing + " is "
            "{{ $value | printf \"%.3g\" }}, more than "
            f"{b.divergence_factor:g} x its lowest {b.divergence_smoothing} average over the "
            f"last {b.divergence_window}.",
            "Look for grad-norm spikes and LR schedule changes on the Job overview dashboard; "
            "a restart from a checkpoint with new data order or lower LR usually helps.",
        ),
        alert(
            "FsdpmonThroughputDropped",
            f"{job_tps}\n  < {b.throughput_drop_ratio:g} * avg_over_time({job_tps}"
            f"[{b.throughput_window}] offset {b.throughput_for})",
            b.throughput_for,
            "Throughput of {{ $labels.job_name }} dropped",
            "The job processes {{ $value | humanize }} tokens/s, less than "
            f"{b.throughput_drop_ratio:g} x its own average over the {b.throughput_window} "
            "before.",
            "Find what changed: a straggling rank (Ranks dashboard), GPU throttling or XIDs "
            "(Nodes dashboard), data wait rising, checkpoint phases growing, or a restart onto "
            "fewer or slower nodes.",
        ),
    ]


def _memory_alerts(b: RuleBounds) -> list[Rule]:
    peak = m(catalog.TRAIN_MEMORY_PEAK_ACTIVE_BYTES)
    cap = m(catalog.TRAIN_DEVICE_MEMORY_CAPACITY_BYTES)
    w = b.allocator_window
    return [
        alert(
            "FsdpmonGPUMemoryNearCapacity",
            # Peak *active* memory, not what the GPU reports used: PyTorch's caching allocator
            # keeps most of the device reserved in a healthy run.
            f"{peak} / ({cap} > 0) > {b.memory_ratio:g}",
            b.memory_for,
            "Device memory near capacity on rank {{ $labels.rank }} of {{ $labels.job_name }}",
            "Peak active memory reached {{ $value | humanizePercentage }} of the device; the "
            "next larger batch, sequence or checkpoint may run out of memory.",
            "Reduce the micro-batch or sequence length, enable activation checkpointing or CPU "
            "offload, or shard over more ranks; check for fragmentation (reserved far above "
            "active on the Ranks dashboard).",
        ),
        alert(
            "FsdpmonAllocatorRetries",
            f"{rose(m(catalog.TRAIN_ALLOC_RETRIES_TOTAL), w)}\nor\n"
            f"{rose(m(catalog.TRAIN_OOMS_TOTAL), w)}",
            "",
            "CUDA allocator retries or OOMs on {{ $labels.job_name }} rank {{ $labels.rank }}",
            f"The caching allocator had to free its cache and retry (or hit OOM) in the last {w}; "
            "each retry synchronises the device and slows every rank.",
            "Memory is at the limit: lower the micro-batch or sequence length, enable activation "
            "checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
            "fragmentation.",
        ),
    ]


def target_alerts(b: RuleBounds) -> list[Rule]:
    lb = b.missing_lookback
    train = m(catalog.TRAIN_INFO)
    exporter = m(catalog.EXPORTER_INFO)
    stale = m(catalog.EXPORTER_SAMPLE_STALE)
    return [
        alert(
            "FsdpmonTrainingTargetDown",
            "(up == 0)\n  * on (instance, job) group_left (job_name)\n"
            f"  group by (instance, job, job_name) (max_over_time({train}[{lb}]))",
            b.target_down_for,
            "Training metrics endpoint {{ $labels.instance }} of {{ $labels.job_name }} is down",
            "Prometheus cannot scrape {{ $labels.instance }}, which served training metrics "
            f"within the last {lb}.",
            "The pod may have crashed or be hung in a way that blocks its metrics thread; "
            "check the pod status, restarts and logs, and the PodMonitor/port (fsdpmon-train).",
            detail="train",
        ),
        alert(
            "FsdpmonExporterDown",
            "((up == 0)\n  and on (instance, job)\n"
            f"  group by (instance, job) (max_over_time({exporter}[{lb}])))\nor\n"
            f"{stale} == 1",
            b.exporter_down_for,
            "fsdpmon exporter {{ $labels.instance }} is down or stale",
            "The per-node exporter cannot be scraped, or its background sampler has not "
            "finished a sample in time; GPU, host and process metrics of the node are missing.",
            "Check the exporter DaemonSet pod on the node (logs, restarts, resource limits) "
            "and whether NVML answers there (`nvidia-smi`).",
            detail="exporter",
        ),
    ]
