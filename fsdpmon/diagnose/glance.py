"""What one refresh shows before the evidence window confirms it: the newest snapshot's facts
as findings, in the engine's causes and severities.

A finding of the engine needs its evidence in every snapshot of DIAGNOSIS_EVIDENCE_SECONDS.
These facts are told by one snapshot, because their sources held them over time already (a
rank is stalled once its heartbeat is past the monitor's stall threshold; the monitor flags a
straggler only when two disjoint busy-time medians agree) or because they are final (a rank
gone before its last step or never seen, a target that did not answer, a GPU not seen up, a
non-finite loss, memory at the pressure line). They are what `top`'s header says at once and
all that `top --once`, a single refresh, can say; what needs the history (a hang's culprit, a
throttled GPU behind a straggler, XIDs, a crash loop) they never claim.

A fact that held over the whole window is the engine's to state (as a finding, or as evidence
of one), so the glance leaves it out: it shows what is newer than the window.

The summaries are the header's lines; a silent target is critical here (one refresh cannot
tell which ranks it held), where the engine, with the history, names its ranks missing, or,
when every rank went with it at once, the target, its ranks as evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from fsdpmon.conventions import (
    DIAGNOSIS_EVIDENCE_SECONDS,
    MEMORY_PRESSURE_RATIO,
    STRAGGLER_SCORE_THRESHOLD,
    Severity,
    cause_severity,
)
from fsdpmon.diagnose.desync_rules import Desync, waiting_mismatch
from fsdpmon.diagnose.findings import Finding, where, where_all
from fsdpmon.diagnose.observe import Places
from fsdpmon.diagnose.straggler_rules import straggler_cause
from fsdpmon.diagnose.window import Window
from fsdpmon.job.snapshot import JobSnapshot

MAX_NAMED = 8  # ranks, targets or GPUs a summary names before it counts the rest
MAX_EVIDENCE = 8  # evidence lines of one kind (the header shows one line; --json all of these)
MAX_PLACES = 6  # GPUs ("node-1/0") or "rank N" a summary names: longer names, fewer of them


def rank_list(ranks: Sequence[int | str], limit: int = MAX_NAMED) -> str:
    """'0, 1, 2 (+5 more)'."""
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" (+{len(ranks) - limit} more)" if len(ranks) > limit else "")


def _stalled(now: JobSnapshot, ranks: list[Any], places: Places) -> Finding:
    evidence = []
    for rank in ranks[:MAX_EVIDENCE]:
        row = places.ranks[rank]
        age = "no step yet" if row.heartbeat_age_s is None else (
            f"no step for {row.heartbeat_age_s:.0f}s")
        line = ("unknown" if row.stall_threshold_s is None  # the stalled flag, served alone
                else f"{row.stall_threshold_s:.0f}s")
        evidence.append(f"rank {rank}: {age}, past its stall threshold ({line})")
    return Finding("hang", Severity.CRITICAL,
                   f"rank {rank_list(ranks)} stalled: no step within the threshold",
                   evidence=tuple(evidence),
                   **where_all(places, ranks, ranks[0] if len(ranks) == 1 else None))


def _desync_ranks(snap: JobSnapshot) -> list[int]:
    """Stalled ranks waiting in different calls at one collective number: a desync's ranks,
    not a hang's (the engine's rule, on the one snapshot)."""
    found = waiting_mismatch(snap)
    return [] if found is None else sorted(found.ranks)


def _desync(now: JobSnapshot, ranks: list[Any], places: Places) -> Finding:
    found = waiting_mismatch(now) or Desync((), "", (), "")  # (the keys found one)
    culprits = list(found.culprits)
    evidence = [" vs ".join(found.sides) + f" {found.where}"]
    if culprits:
        evidence.append(f"culprit: rank {rank_list(culprits)} ({found.why})")
    who = f"rank {rank_list(culprits)}" if culprits else f"ranks {rank_list(ranks)}"
    return Finding("collective_desync", Severity.CRITICAL,
                   f"collective desync: {who} in other collectives {found.where}",
                   evidence=tuple(evidence),
                   **where_all(places, culprits, culprits[0] if len(culprits) == 1 else None))


def _targets_down(now: JobSnapshot, urls: list[Any], places: Places) -> Finding:
    asked = set(urls)
    down = [t for t in now.targets if t.url in asked]
    names = ", ".join(t.pod or t.url for t in down[:4]) + (" ..." if len(down) > 4 else "")
    pods, nodes = {t.pod for t in down}, {t.node for t in down}
    # the most urgent of theirs (conventions.TARGET_DOWN_SEVERITY: a training endpoint is
    # critical, an exporter a warning), as the alerts have it
    severity = min((cause_severity("target_down", t.kind) for t in down),
                   key=lambda s: s is not Severity.CRITICAL, default=cause_severity("target_down"))
    return Finding("target_down", severity,
                   f"{len(down)} of {len(now.targets)} targets down: {names}",
                   evidence=tuple(f"{t.url} ({t.kind}) does not answer: "
                                  f"{t.error or 'no answer'}" for t in down[:MAX_EVIDENCE]),
                   pod=pods.pop() or None if len(pods) == 1 else None,
                   node=nodes.pop() or None if len(nodes) == 1 else None)


def _never_seen(now: JobSnapshot, absent: list[Any], places: Places) -> Finding:
    reporting = sum(1 for r in places.ranks if 0 <= r < (now.world_size or 0))
    return Finding("rank_missing", Severity.CRITICAL,
                   f"only {reporting} of {now.world_size} ranks report; rank "
                   f"{rank_list(absent)} never seen",
                   evidence=(f"the ranks say the world size is {now.world_size}; no target "
                             f"serves rank {rank_list(absent)}",),
                   rank=absent[0] if len(absent) == 1 else None)


def _gone(now: JobSnapshot, ranks: list[Any], places: Places) -> Finding:
    rows = [places.ranks[r] for r in ranks]
    steps = [r.step for r in rows if r.step is not None]
    last = ""
    if steps:
        total = f"/{now.total_steps}" if now.total_steps else ""
        last = f" (last seen at step {min(steps)}{total})"
    evidence = tuple(f"rank {r.rank} stopped reporting at step "
                     f"{'?' if r.step is None else r.step}, short of its last"
                     for r in rows[:MAX_EVIDENCE])
    return Finding("rank_missing", Severity.CRITICAL,
                   f"rank {rank_list(ranks)} gone before the last step{last}",
                   evidence=evidence,
                   **where_all(places, ranks, ranks[0] if len(ranks) == 1 else None))


def _straggler(now: JobSnapshot, ranks: list[Any], places: Places) -> Finding:
    row = places.ranks[ranks[0]]
    score = row.straggler_score or 0.0
    # The monitor's flag clears only when two disjoint medians agree, so the score of the
    # moment may sit just above the line while the flag still stands.
    side = "<" if score < STRAGGLER_SCORE_THRESHOLD else "≥"
    cause, detail = straggler_cause(row, [r for r in now.ranks if not r.down])
    return Finding(cause, Severity.WARNING,
                   f"rank {row.rank} straggles: score {score:.2f} {side} "
                   f"{STRAGGLER_SCORE_THRESHOLD:g} (the others wait for it)",
                   evidence=(f"the monitor flags it: straggler score {score:.2f} (the median "
                             "rank's busy time over its own)", detail),
                   **where(places, row.rank))


def _memory(now: JobSnapshot, tight: list[Any], places: Places) -> Finding:
    rank = next((r for r in now.tight_ranks if f"rank {r}" in tight), None)
    return Finding("memory_pressure", Severity.WARNING,
                   f"memory ≥{MEMORY_PRESSURE_RATIO:.0%} used: {rank_list(tight, MAX_PLACES)}",
                   evidence=tuple(f"{t} at or above {MEMORY_PRESSURE_RATIO:.0%} of its memory"
                                  for t in tight[:MAX_EVIDENCE]),
                   **where(places, rank))


def _lost(now: JobSnapshot, gpus: list[Any], places: Places) -> Finding:
    unheard = {t.node for t in now.targets if not t.up}
    evidence = tuple(f"GPU {gpu} on {node} not seen up: "
                     + ("its node's exporter does not answer" if node in unheard
                        else "NVML reports it lost") for node, gpu in gpus[:MAX_EVIDENCE])
    nodes = {node for node, _ in gpus}
    place = where(places, places.rank_of(gpus[0]), gpus[0]) if len(gpus) == 1 else {
        "rank": None, "pod": None, "node": nodes.pop() if len(nodes) == 1 else None,
        "gpu": None}
    return Finding("gpu_lost", Severity.CRITICAL,
                   f"GPU lost: {rank_list([f'{n}/{g}' for n, g in gpus], MAX_PLACES)}",
                   evidence=evidence, **place)


def _nonfinite(now: JobSnapshot, ranks: list[Any], places: Places) -> Finding:
    return Finding("loss_nonfinite", Severity.CRITICAL,
                   f"loss is NaN or infinite on rank {rank_list(ranks)}",
                   evidence=(f"rank {rank_list(ranks)} serves a non-finite loss",),
                   **where_all(places, ranks, ranks[0] if len(ranks) == 1 else None))


def _tight(snap: JobSnapshot) -> list[str]:
    return ([f"{g.node}/{g.gpu}" for g in snap.tight_gpus]
            + [f"rank {r}" for r in snap.tight_ranks])


Keys = Callable[[JobSnapshot], Sequence[Hashable]]
Name = Callable[[JobSnapshot, list[Any], Places], Finding]

# (the fact's keys in a snapshot, the finding that names them), in the order the header
# lists them: what stops the job, what did not answer and the ranks it took, then the rest.
FACTS: tuple[tuple[Keys, Name], ...] = (
    (_desync_ranks, _desync),
    (lambda s: [r for r in s.stalled_ranks if r not in _desync_ranks(s)], _stalled),
    (lambda s: [t.url for t in s.down_targets], _targets_down),
    (lambda s: s.unseen_ranks(), _never_seen),
    (lambda s: [r.rank for r in s.gone_ranks], _gone),
    (lambda s: [r.rank] if (r := s.flagged_straggler) else [], _straggler),
    (_tight, _memory),
    (lambda s: [(g.node, g.gpu) for g in s.lost_gpus], _lost),
    (lambda s: s.nonfinite_ranks, _nonfinite),
)


def glance(history: Sequence[JobSnapshot],
           span_s: float = DIAGNOSIS_EVIDENCE_SECONDS) -> list[Finding]:
    """The newest snapshot's facts as findings, but for those that held in every snapshot of
    the last ``span_s`` (the engine speaks for those); snapshots oldest first."""
    if not history:
        return []
    window = Window(history, span_s)
    places: Places | None = None
    out = []
    for keys, name in FACTS:
        now = list(keys(window.now))
        if not now:
            continue
        held = window.lasting(keys)
        new = [k for k in now if k not in held]
        if new:
            places = places or Places(history)
            out.append(name(window.now, new, places))
    return out
