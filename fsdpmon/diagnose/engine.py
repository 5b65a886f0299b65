"""The diagnosis: observations over the window → findings, causes before symptoms.

Each rule takes the facts it explains out of the observations, so a cascade is one finding:
a lost GPU explains its rank's stall and every rank waiting for it; an unresponsive rank
explains the others' stalls; a throttled GPU explains its rank's straggling.

``judge`` is the one verdict `top` and `diagnose` read: these findings, and beside them the
glance at the newest refresh (fsdpmon.diagnose.glance) for what has not held that long yet.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    DIAGNOSIS_EVIDENCE_SECONDS,
    EXIT_KILLED,
    Severity,
    cause_severity,
)
from fsdpmon.diagnose.after import restart_cause
from fsdpmon.diagnose.cpu_rules import starved
from fsdpmon.diagnose.desync_rules import desync
from fsdpmon.diagnose.exits import died, exit_evidence
from fsdpmon.diagnose.findings import (
    Finding,
    Verdict,
    age,
    median,
    ranked,
    ranks_text,
    waiters,
    where,
    where_all,
)
from fsdpmon.diagnose.glance import glance
from fsdpmon.diagnose.gpu_rules import gpu_ecc, gpu_lost, gpu_xid, memory, throttled
from fsdpmon.diagnose.loss_rules import loss
from fsdpmon.diagnose.observe import Observations, Places, observe
from fsdpmon.diagnose.stacks import RankStack, StackClass, merge
from fsdpmon.diagnose.straggler_rules import stragglers
from fsdpmon.diagnose.window import Window
from fsdpmon.job.snapshot import JobSnapshot, RankRow


def judge(history: Sequence[JobSnapshot], stacks: Sequence[RankStack] = (),
          span_s: float = DIAGNOSIS_EVIDENCE_SECONDS) -> Verdict:
    """The verdict on snapshots oldest first: the findings over the window and, beside them,
    what the newest refresh shows that has not held for ``span_s`` yet (glance). One snapshot
    (`top --once`) gets the glance alone."""
    if not history:
        return Verdict(span_s=span_s)
    return Verdict(tuple(diagnose(history, stacks, span_s)), history[-1].time - history[0].time,
                   span_s, tuple(glance(history, span_s)))


def diagnose(history: Sequence[JobSnapshot], stacks: Sequence[RankStack] = (),
             span_s: float = DIAGNOSIS_EVIDENCE_SECONDS) -> list[Finding]:
    """Findings, most urgent first, from snapshots oldest first (the last is now) and, when
    ranks are stalled, the stacks they published. No verdict before ``span_s`` of history."""
    if not history:
        return []
    window = Window(history, span_s)
    obs = observe(window)
    places = Places(history)
    out: list[Finding] = []
    # In this order: each rule takes the facts it explains out of ``obs`` before the next
    # reads them (a lost or ECC-failing GPU's XIDs are not gpu_xid's; its rank's stall is
    # not a hang of its own).
    for rule in (gpu_lost, gpu_ecc, gpu_xid, _unresponsive, _missing):
        out += rule(obs, places, stacks)
    out += desync(window, obs, places, stacks)  # before _hang: a desync's hang is the desync
    out += _hang(obs, places, stacks)
    for rule in (stragglers, starved, throttled, loss, memory, _checkpoint, _targets):
        out += rule(obs, places)
    return ranked(out)


def _unresponsive(obs: Observations, places: Places,
                  stacks: Sequence[RankStack]) -> list[Finding]:
    out = []
    for rank in sorted(obs.unresponsive):
        evidence = [f"its monitor thread has not run for {obs.seconds:.0f}s or more (process "
                    f"stopped or holding the GIL){age(places.rank(rank))}"]
        evidence += waiters(obs, {rank})
        classes = merge(stacks) if stacks else []
        evidence += [c.describe() for c in classes]
        out.append(Finding("rank_unresponsive", Severity.CRITICAL, f"rank {rank} is unresponsive",
                           evidence=tuple(evidence), stacks=tuple(classes),
                           **where(places, rank)))
    obs.unresponsive.clear()
    return out


def _missing(obs: Observations, places: Places, _stacks: Sequence[RankStack]) -> list[Finding]:
    """The first ranks to vanish are the culprits; those that went with them are evidence.

    When one rank dies, torchrun's agent stops all the others and restarts the group, so every
    rank vanishes at once and the scrapes cannot tell who went first: then the culprit is the
    rank whose restarted process said its previous life was killed (a crash loop's rank that
    keeps dying), else nobody yet. Once ranks are back (those slow to restart are evidence, not
    culprits), a rank that says it was killed is named while that report is recent
    (CRASH_EVIDENCE_SECONDS)."""
    if not obs.missing or (obs.restarts is not None and died(obs.exits)[0]
                           and any(not r.down for r in obs.now.ranks)):
        return _died(obs, places)  # (ranks still missing are being restarted: evidence)
    first = min(obs.missing_since.get(r, obs.now.time) for r in obs.missing)
    culprits = sorted(r for r in obs.missing if obs.missing_since.get(r, obs.now.time) == first)
    later = sorted(obs.missing - set(culprits))
    evidence = [f"{ranks_text(culprits)} stopped reporting {obs.now.time - first:.0f}s ago"]
    everyone = len(culprits) > 1 and not later and all(r.down for r in obs.now.ranks)
    if everyone and _only_the_endpoints(obs, places, culprits):
        obs.missing.clear()  # _targets names the silent endpoints, with the ranks they served
        return []
    if everyone:
        evidence[0] += " all at once (the elastic agent stops every rank when one dies)"
        evidence += [f"at the last restart: {e}" for e in exit_evidence(obs.exits)] or [
            "which rank died first cannot be told from outside: its restarted process says"]
        culprits = [r for r in died(obs.exits)[0] if r in culprits] or culprits
    rank = culprits[0] if len(culprits) == 1 or not everyone else None
    row = places.rank(culprits[0])
    if row is not None and row.target in obs.targets_down:
        evidence.append(f"its target {row.target} does not answer")
    if later:
        evidence.append(f"{ranks_text(later)} stopped after it")
    evidence += waiters(obs, set(culprits))
    obs.targets_down -= {places.ranks[r].target for r in obs.missing if r in places.ranks}
    nodes = {places.ranks[r].node for r in culprits if r in places.ranks} - {""}
    same_node = {t.url for t in obs.now.targets if t.url in obs.targets_down and t.node in nodes}
    if same_node:
        evidence.append("the node's other targets do not answer either: "
                        + ", ".join(sorted(same_node)))
        obs.targets_down -= same_node
    obs.missing.clear()
    text = ranks_text(culprits)
    cause, summary = _cause(obs, evidence, f"{text} missing", f"crash loop: {text} keeps failing")
    return [Finding(cause, Severity.CRITICAL, summary, evidence=tuple(evidence),
                    **where_all(places, culprits, rank))]


def _only_the_endpoints(obs: Observations, places: Places, ranks: list[int]) -> bool:
    """Every rank went at once with the endpoints that served them (the elastic agent stopping
    the group takes the pod's server with it) and no restarted rank has said who died: all that
    is known is targets down, as the page has it (no series of a rank is left for a rule to
    count); the rank to blame, or the crash loop, comes with the restart (``_died``)."""
    targets = {places.ranks[r].target for r in ranks if r in places.ranks}
    return bool(targets) and targets <= obs.targets_down and not died(obs.exits)[0]


def _cause(obs: Observations, evidence: list[str], missing: str, loop: str) -> tuple[str, str]:
    """crash_loop (with the restarts as evidence) when the job restarted CRASH_LOOP_RESTARTS
    times within the history, else rank_missing."""
    restarts = obs.restarts
    cause = restart_cause(0 if restarts is None else restarts[1] - restarts[0])
    if restarts is not None and cause == "crash_loop":
        evidence.insert(0, f"job restarted {restarts[1] - restarts[0]:.0f} times "
                           f"({restarts[0]:.0f} → {restarts[1]:.0f})")
        return cause, loop
    return cause, missing


def _died(obs: Observations, places: Places) -> list[Finding]:
    """Ranks back after a restart whose previous lives brought the group down (killed, or an
    error that made the agent stop the others), while that report is recent."""
    culprits, how = died(obs.exits)
    if not culprits:
        return []
    evidence = exit_evidence(obs.exits)
    if obs.missing:
        evidence.append(f"{ranks_text(sorted(obs.missing))} not back yet")
        obs.targets_down -= {places.ranks[r].target for r in obs.missing if r in places.ranks}
        obs.missing.clear()
    if obs.restarts is not None:
        evidence.append(f"the elastic agent restarted every rank ({obs.restarts[0]:.0f} → "
                        f"{obs.restarts[1]:.0f} restarts)")
    text = ranks_text(culprits)
    ended, keeps = (("died (killed)", "keeps dying (killed)") if how == EXIT_KILLED else
                    ("failed (an error)", "keeps failing (an error)"))
    cause, summary = _cause(obs, evidence, f"{text} {ended}; the job restarted",
                            f"crash loop: {text} {keeps}")
    return [Finding(cause, Severity.CRITICAL, summary, evidence=tuple(evidence),
                    **where_all(places, culprits, culprits[0] if len(culprits) == 1 else None))]


def _hang_culprit(obs: Observations, places: Places,
                  classes: list[StackClass]) -> tuple[list[int], str]:
    """The odd stack class (behind in collectives, or smallest), else the rank behind in
    steps; ([], reason) when the ranks cannot be told apart."""
    if len(classes) > 1:
        return list(classes[0].ranks), "odd stack class"
    culprits, why = progress_culprits([r for r in places.ranks.values() if not r.down])
    if culprits:
        return culprits, why
    live = [r for r in places.ranks.values() if not r.down and r.step is not None]
    steps = sorted({r.step for r in live})
    if len(steps) > 1:
        behind = [r.rank for r in live if r.step == steps[0]]
        if len(behind) < len(live) / 2:
            return behind, f"behind at step {steps[0]} (others at {steps[-1]})"
    return [], "every rank stalled alike"


def progress_culprits(live: Sequence[RankRow]) -> tuple[list[int], str]:
    """From the progress evidence (what Prometheus holds too, where stacks are not): the ranks
    whose last collective is below the others' (each collective waits for every rank, so the
    others cannot go on without them), else the ranks outside a collective while others wait
    inside one. A rank that only waits is never named."""
    entered = [r.collective_entered for r in live if r.collective_entered is not None]
    if entered and min(entered) < max(entered):
        low, high = min(entered), max(entered)
        behind = [r.rank for r in live if r.collective_entered is not None
                  and r.collective_entered < high]
        return sorted(behind), f"behind in collectives: at #{low}, others at #{high}"
    inside = [r.rank for r in live if r.in_collective]
    outside = [r.rank for r in live if r.in_collective is False]
    if inside and outside:
        return sorted(outside), (f"outside a collective while {len(inside)} "
                                 f"rank{'s' if len(inside) > 1 else ''} wait inside one")
    return [], ""


def _hang(obs: Observations, places: Places, stacks: Sequence[RankStack]) -> list[Finding]:
    if not obs.stalled:
        return []
    classes = merge(stacks)
    culprits, why = _hang_culprit(obs, places, classes)
    stalled = sorted(obs.stalled)
    evidence = [f"culprit: {ranks_text(culprits)} ({why})"] if culprits else []
    evidence += [c.describe() for c in classes]
    evidence.append(f"{ranks_text(stalled)} made no step for {obs.seconds:.0f}s or more"
                    f"{age(places.rank(stalled[0]))}")
    obs.stalled.clear()
    rank = culprits[0] if len(culprits) == 1 else None
    holds = "holds" if len(culprits) == 1 else "hold"
    summary = (f"{ranks_text(culprits)} {holds} up {len(stalled) - len(culprits)} ranks"
               if culprits else f"{ranks_text(stalled)} stalled, none behind the others")
    return [Finding("hang", Severity.CRITICAL, summary, evidence=tuple(evidence),
                    stacks=tuple(classes), **where(places, rank))]


def _checkpoint(obs: Observations, places: Places) -> list[Finding]:
    """Saves taking CHECKPOINT_SHARE_LIMIT of the time (held over the window); the rank whose
    own save work held the others up is named, as a straggler is by its busy time."""
    if not obs.checkpoint_heavy:
        return []
    live = [r for r in obs.now.ranks if not r.down and r.checkpoint_seconds is not None]
    share = median([r.checkpoint_time_ratio for r in live if r.checkpoint_time_ratio is not None])
    wall = median([r.checkpoint_seconds or 0.0 for r in live])
    evidence = [f"the last save took {wall:.3g}s, {share:.0%} of the time since the save "
                f"before it (limit {CHECKPOINT_SHARE_LIMIT:.0%})"]
    holdups = sorted(obs.checkpoint_holdups,
                     key=lambda r: (-(places.ranks[r].checkpoint_own_seconds or 0.0), r))
    rank = holdups[0] if holdups else None
    summary = f"checkpointing takes {share:.0%} of the time"
    if rank is not None:
        own = places.ranks[rank].checkpoint_own_seconds or 0.0
        others = median([r.checkpoint_own_seconds or 0.0 for r in live if r.rank != rank])
        evidence.append(f"rank {rank}'s own save work took {own:.3g}s of it, the other ranks' "
                        f"{others:.3g}s: they waited for rank {rank}")
        if len(holdups) > 1:
            evidence.append(f"{ranks_text(holdups)} all saved slowly")
        summary += f": rank {rank}'s save holds up the others"
    return [Finding("checkpoint_slow", Severity.WARNING, summary, evidence=tuple(evidence),
                    **where(places, rank))]


def _targets(obs: Observations, places: Places) -> list[Finding]:
    out = []
    status = {t.url: t for t in obs.now.targets}
    for url in sorted(obs.targets_down):
        t = status[url]
        evidence = [f"{url} ({t.kind}) not answering for {obs.seconds:.0f}s: "
                    f"{t.error or 'no answer'}"]
        served = sorted(r for r, row in places.ranks.items() if row.target == url and row.down)
        if served:
            evidence.append(f"it served {ranks_text(served)}, silent with it: which rank "
                            "died first, its restarted process will say")
        # a training endpoint is critical, an exporter a warning: the alerts' table
        out.append(Finding("target_down", cause_severity("target_down", t.kind),
                           f"target {t.pod or url} down", evidence=tuple(evidence),
                           pod=t.pod or None, node=t.node or None))
    return out
