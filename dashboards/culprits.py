"""Who a stalled job waits for, from the ranks' progress evidence: the recording rules that name
each job's culprit ranks, and the stall alerts that page once per incident with the culprit in
their labels.

In synchronous training every collective waits for every rank, so when one rank stops the others
stop too, a collective later: each of them is "stalled", but only the rank they wait for is the
cause. Which one it is, in the order the rules check it (the first that names a rank wins):
- unresponsive: its process runs no Python (stopped, or hung holding the GIL);
- behind: its last collective's number is below the job's highest (the others went on into
  the next one and wait there for it);
- outside: it is outside a collective while other ranks of the job wait inside one.
- desync (FsdpmonCollectiveDesync, cause collective_desync): every rank of the job waits at the
  same collective number but not in the same call (op or elements), and this rank's call
  breaks the pattern of its own step before; named without waiting for the stall bound (its
  `for` rides out a torn read), and the stall alert stays quiet for that job.
A rank that vanished is FsdpmonTrainingRankMissing's (it names the rank): the stall alert stays
quiet for that job, so one incident is one page. When every rank waits alike (a network or NCCL
hang) the stall alert names the job only, never a waiting rank.
"""

from __future__ import annotations

from fsdpmon import catalog
from fsdpmon.dashboards.promql import JOB_KEYS, m
from fsdpmon.dashboards.rulebase import AGE, HEARTBEAT, Rule, RuleBounds, alert

RANK_KEYS = f"{JOB_KEYS}, rank"
CULPRIT = m(catalog.REC_RANK_STALL_CULPRIT_SECONDS)
ENTERED = m(catalog.TRAIN_COLLECTIVE_ENTERED_SEQ)
INSIDE = m(catalog.TRAIN_IN_COLLECTIVE)
SINCE = m(catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS)
BOUND = m(catalog.TRAIN_STALL_THRESHOLD_SECONDS)
STALLED_JOB = m(catalog.REC_JOB_STALLED_RANKS_COUNT)
MISSING_ALERT = 'ALERTS{alertname="FsdpmonTrainingRankMissing"}'
# Seconds the rank has been where it is (its progress evidence unchanged); a rank that never
# published it, since its last step.
HELD = f"((time() - {SINCE}) or (time() - {HEARTBEAT}) or {AGE})"
OFF_PATTERN = m(catalog.TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN)


def _spread(metric: str) -> str:
    """How far apart the job's ranks are in ``metric`` (0: all alike)."""
    return f"(max by ({JOB_KEYS}) ({metric}) - min by ({JOB_KEYS}) ({metric}))"


def desync_culprits() -> str:
    """Ranks inside a collective whose call breaks their own pattern while the job's ranks
    wait at one collective number in different calls: the rank that did otherwise."""
    calls = (f"{_spread(m(catalog.TRAIN_COLLECTIVE_ENTERED_OP))} > 0\n"
             f"  or {_spread(m(catalog.TRAIN_COLLECTIVE_ENTERED_ELEMENTS))} > 0")
    return (f"{HELD}\n  and on ({RANK_KEYS}) ({INSIDE} == 1)\n"
            f"  and on ({RANK_KEYS}) ({OFF_PATTERN} == 1)\n"
            f"  and on ({JOB_KEYS}) ({_spread(ENTERED)} == 0)\n"
            f"  and on ({JOB_KEYS}) (\n  {calls}\n)")


def stalled_ranks() -> str:
    """Ranks past the stall bound they publish (max(FSDPMON_STALL_FACTOR x median step time,
    FSDPMON_STALL_FLOOR_SECONDS), the one their own watchdog, `top` and `diagnose` use): the
    value is the seconds since their last step (before the first one: since the monitor's
    start). The rules hold no bound of their own, so a rank's settings move its page too."""
    return f"((time() - {HEARTBEAT}) or {AGE})\n  > {BOUND}"


def _culprit(reason: str, cause: str, expr: str) -> Rule:
    return {"record": catalog.REC_RANK_STALL_CULPRIT_SECONDS.name, "expr": expr,
            "labels": {"cause": cause, "reason": reason}}


def culprit_records() -> list[Rule]:
    """Per job: how many ranks are stalled and how many wait inside a collective; per culprit
    rank, how long it has been where it is (one series per rank, the reason in `reason`)."""
    by = f"by ({JOB_KEYS})"
    stalled_job = f"on ({JOB_KEYS}) {STALLED_JOB}"
    unresponsive = f"({m(catalog.TRAIN_UNRESPONSIVE)} == 1)"
    highest = m(catalog.REC_JOB_COLLECTIVE_ENTERED_SEQ_MAX)
    behind = f"({ENTERED} < on ({JOB_KEYS}) group_left {highest})"
    waiting = m(catalog.REC_JOB_WAITING_RANKS_COUNT)
    outside = f"({INSIDE} == 0)\n  and on ({JOB_KEYS}) ({waiting} > 0)"
    return [
        {"record": catalog.REC_JOB_STALLED_RANKS_COUNT.name,
         "expr": f"count {by} (\n  {stalled_ranks()}\n)"},
        {"record": catalog.REC_JOB_COLLECTIVE_ENTERED_SEQ_MAX.name,
         "expr": f"max {by} ({ENTERED})"},
        # a rank stopped inside a collective (SIGSTOP mid-step) still says so: it waits for
        # nobody, it is the one waited for
        {"record": catalog.REC_JOB_WAITING_RANKS_COUNT.name,
         "expr": f"count {by} (\n  ({INSIDE} == 1)\n  unless on ({RANK_KEYS}) {unresponsive}\n)"
                 f" and {stalled_job}"},
        _culprit("desync", "collective_desync", desync_culprits()),
        _culprit("unresponsive", "rank_unresponsive",
                 f"{HELD}\n  and on ({RANK_KEYS}) {unresponsive}\n  and {stalled_job}"),
        _culprit("behind", "hang",
                 f"{HELD}\n  and on ({RANK_KEYS}) {behind}\n  and {stalled_job}\n"
                 f"  unless on ({RANK_KEYS}) {unresponsive}"),
        _culprit("outside", "hang",
                 f"{HELD}\n  and on ({RANK_KEYS}) {outside}\n  and {stalled_job}\n"
                 f"  unless on ({RANK_KEYS}) {unresponsive}\n"
                 f"  unless on ({RANK_KEYS}) {behind}"),
    ]


def _phase() -> str:
    """Go template: the culprit's phase now, read from Prometheus when the alert is sent."""
    phase = m(catalog.TRAIN_PHASE)
    return ('{{ with printf "' + phase + '{job_name=%q,rank=%q} == 1" $labels.job_name '
            '$labels.rank | query }}{{ range . }}{{ .Labels.phase }}{{ end }}'
            '{{ else }}an unknown phase{{ end }}')


def _waiting() -> str:
    waiting = m(catalog.REC_JOB_WAITING_RANKS_COUNT)
    return ('{{ with printf "' + waiting + '{job_name=%q}" $labels.job_name | query }}'
            '{{ . | first | value | printf "%.0f" }}{{ else }}0{{ end }}')


def _bound() -> str:
    """Go template: the job's stall bound now, as its ranks publish it (the largest)."""
    return ('{{ with printf "max(' + BOUND + '{job_name=%q})" $labels.job_name | query }}'
            '{{ . | first | value | humanizeDuration }}{{ else }}unknown{{ end }}: '
            'max(FSDPMON_STALL_FACTOR x the median step time, FSDPMON_STALL_FLOOR_SECONDS)')


_WHERE = ('{{ if eq $labels.reason "behind" }}behind the others in collectives (they went on '
          'into the next one)'
          '{{ else if eq $labels.reason "outside" }}outside a collective while the others wait '
          'inside one'
          '{{ else }}unresponsive: its process runs no Python (stopped, or hung holding the '
          'GIL){{ end }}')
_PLACE = ('{{ if $labels.pod }} (pod {{ $labels.pod }}{{ if $labels.node }} on node '
          '{{ $labels.node }}{{ end }}){{ end }}')


def rank_to_blame() -> str:
    """Jobs whose raw progress series point at a rank: one behind in collectives, one outside
    while another is inside, or one unresponsive. The job-level stall arm reads these, not the
    culprit records: a ruler that reads its records back from storage (vmalert writes them to
    VictoriaMetrics and queries them there) sees them evaluations late, and in that gap the
    records would say "no culprit" while a rank is behind (issue 49)."""
    unresponsive = f"max by ({JOB_KEYS}) ({m(catalog.TRAIN_UNRESPONSIVE)})"
    return (f"{_spread(ENTERED)} > 0\n  or {_spread(INSIDE)} > 0\n"
            f"  or {unresponsive} == 1")


def culprit_alerts(b: RuleBounds) -> list[Rule]:
    hang = (f"{CULPRIT}{{cause=\"hang\"}}\n"
            f"  unless on ({JOB_KEYS}) {CULPRIT}{{cause=\"rank_unresponsive\"}}\n"
            f"or\n(max by ({JOB_KEYS}) (\n  {stalled_ranks()}\n)\n"
            f"  unless on ({JOB_KEYS}) {CULPRIT}\n"
            f"  unless on ({JOB_KEYS}) (\n  {rank_to_blame()}\n)\n"
            f"  unless on ({JOB_KEYS}) {MISSING_ALERT})")
    return [
        alert(
            "FsdpmonCollectiveDesync", f"{CULPRIT}{{cause=\"collective_desync\"}}",
            b.stall_for,
            "Training job {{ $labels.job_name }}: rank {{ $labels.rank }} called another "
            "collective than the others",
            "Rank {{ $labels.rank }}" + _PLACE + " waits in a collective that breaks the "
            "pattern of its own steps before, while the other ranks wait in another call at "
            "the same collective number, for {{ $value | humanizeDuration }}: a collective "
            "under `if rank == ...` or a data-dependent branch. The job hangs until the NCCL "
            "watchdog kills it.",
            "Look at that rank's call site: `fsdpmon diagnose` gives both calls and the stack; "
            "`py-spy dump --pid PID` in its pod. The others only wait for it.",
        ),
        alert(
            "FsdpmonTrainingStalled", hang, b.stall_for,
            "{{ if $labels.rank }}Training job {{ $labels.job_name }} is stalled: rank "
            "{{ $labels.rank }} holds it up{{ else }}Training job {{ $labels.job_name }} is "
            "stalled: every rank waits alike{{ end }}",
            "{{ if $labels.rank }}Rank {{ $labels.rank }}" + _PLACE + " has been " + _WHERE
            + " for {{ $value | humanizeDuration }}, in phase " + _phase() + "; "
            + _waiting() + " ranks wait for it.{{ else }}No rank of {{ $labels.job_name }} "
            "completed a step for {{ $value | humanizeDuration }}, more than its stall bound ("
            + _bound() + "), and none is behind the others: they all wait in the same "
            "collective.{{ end }}",
            "With a culprit: look at that rank only (`kubectl logs POD`, `py-spy dump` in its "
            "pod, its GPU's XIDs); the others only wait for it. Without one: a collective that "
            "never completes on every rank points at the network (NCCL/EFA) or a rank outside "
            "the monitor's view; `fsdpmon diagnose --prometheus` says the same.",
        ),
        alert(
            "FsdpmonRankUnresponsive", f"{CULPRIT}{{cause=\"rank_unresponsive\"}}",
            b.stall_for,
            "Rank {{ $labels.rank }} of {{ $labels.job_name }} is unresponsive and the job "
            "waits for it",
            "Rank {{ $labels.rank }}" + _PLACE + " has been " + _WHERE + " for "
            "{{ $value | humanizeDuration }}, in phase " + _phase() + "; " + _waiting()
            + " ranks wait for it.",
            "The process is stopped or holds the GIL: `py-spy dump --pid PID` in its pod (a "
            "C call or a lock), `kubectl describe pod` for a debugger, SIGSTOP or eviction.",
        ),
    ]
