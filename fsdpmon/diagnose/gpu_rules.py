"""The device rules of the diagnosis: a lost GPU, uncorrected ECC errors, XIDs, clock events
(throttling) and memory pressure. Each takes the facts it explains out of the observations: a
lost GPU explains its rank's stall and the ranks waiting for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fsdpmon.conventions import Severity, cause_severity, xid_severity
from fsdpmon.diagnose.findings import Finding, age, waiters, where
from fsdpmon.diagnose.observe import GpuKey, Observations, Places
from fsdpmon.diagnose.stacks import RankStack


def gpu_lost(obs: Observations, places: Places, _stacks: Sequence[RankStack]) -> list[Finding]:
    out = []
    for key in sorted(obs.lost):
        rank = places.rank_of(key)
        evidence = [f"GPU {key[1]} on {key[0]} not answering NVML for {obs.seconds:.0f}s"]
        evidence += [f"XID {code} ({a:.0f} → {b:.0f})" for (n, g, code), (a, b)
                     in sorted(obs.xids.items()) if (n, g) == key]
        obs.xids = {k: v for k, v in obs.xids.items() if k[:2] != key}
        if rank is not None:
            evidence.append(f"it serves rank {rank}{age(places.rank(rank))}")
            obs.unresponsive.discard(rank)
            obs.missing.discard(rank)
            evidence += waiters(obs, {rank})
        out.append(Finding("gpu_lost", cause_severity("gpu_lost"), f"GPU {key[1]} on {key[0]} lost"
                           + (f" (rank {rank})" if rank is not None else ""),
                           evidence=tuple(evidence), **where(places, rank, key)))
    return out


def gpu_ecc(obs: Observations, places: Places, _stacks: Sequence[RankStack]) -> list[Finding]:
    out = []
    for key, (before, now) in sorted(obs.ecc.items()):
        rank = places.rank_of(key)
        evidence = [f"uncorrected ECC errors {before:.0f} → {now:.0f}"]
        # the XIDs an uncorrected error raises (48, 94, 95...) are its symptoms, as the alerts
        # have them (FsdpmonGPUXidErrors pages none on a GPU with uncorrected errors)
        evidence += [f"XID {code} ({a:.0f} → {b:.0f})" for (n, g, code), (a, b)
                     in sorted(obs.xids.items()) if (n, g) == key]
        obs.xids = {k: v for k, v in obs.xids.items() if k[:2] != key}
        if rank is not None:
            evidence += waiters(obs, {rank})
            obs.stragglers.discard(rank)
        out.append(Finding("gpu_ecc", cause_severity("gpu_ecc"),
                           f"GPU {key[1]} on {key[0]}: uncorrected ECC errors "
                           f"(+{now - before:.0f})", evidence=tuple(evidence),
                           **where(places, rank, key)))
    return out


def gpu_xid(obs: Observations, places: Places, _stacks: Sequence[RankStack]) -> list[Finding]:
    by_gpu: dict[GpuKey, list[tuple[str, float, float]]] = {}
    # a GPU down now (XID 79: off the bus) is the lost GPU's, named once its loss has held
    # the window; the alerts page no XID of a GPU that is down (FsdpmonGPUXidErrors)
    down = {(g.node, g.gpu) for g in obs.now.lost_gpus}
    for (node, gpu, code), (a, b) in sorted(obs.xids.items()):
        if (node, gpu) in down:
            continue
        by_gpu.setdefault((node, gpu), []).append((code, a, b))
    out = []
    for key, events in by_gpu.items():
        rank = places.rank_of(key)
        # the most urgent of its codes (conventions.xid_severity: the alerts' own table)
        severity = min((xid_severity(code) for code, _, _ in events),
                       key=lambda s: s is not Severity.CRITICAL)
        critical = severity is Severity.CRITICAL
        codes = ", ".join(code for code, _, _ in events)
        evidence = [f"XID {code}: {a:.0f} → {b:.0f}" for code, a, b in events]
        if rank is not None:
            evidence.append(f"it serves rank {rank}")
            if critical:
                evidence += waiters(obs, {rank})
        out.append(Finding("gpu_xid", severity,
                           f"GPU {key[1]} on {key[0]} raised XID {codes}", evidence=tuple(evidence),
                           **where(places, rank, key)))
    return out


def _throttle_severity(reasons: Sequence[str]) -> Severity:
    """The most urgent of the reasons' severities (conventions.THROTTLE_SEVERITY)."""
    return min((cause_severity("gpu_throttled", r) for r in reasons),
               key=lambda s: s is not Severity.CRITICAL, default=cause_severity("gpu_throttled"))


def throttled(obs: Observations, places: Places) -> list[Finding]:
    out = []
    for key, reasons in sorted(obs.throttled.items()):
        rank = places.rank_of(key)
        row = places.rank(rank)
        evidence = [f"clock events active for {obs.seconds:.0f}s: {', '.join(reasons)}"]
        if row is not None and row.straggler_score is not None:
            evidence.append(f"rank {rank} straggler score {row.straggler_score:.2f} "
                            "(not below the threshold yet)")
        out.append(Finding("gpu_throttled", _throttle_severity(reasons),
                           f"GPU {key[1]} on {key[0]} throttled ({', '.join(reasons)})",
                           evidence=tuple(evidence),
                           **where(places, rank, key)))
    return out


def memory(obs: Observations, places: Places) -> list[Finding]:
    if not obs.rank_memory and not obs.gpu_memory:
        return []
    evidence = []
    for rank in sorted(obs.rank_memory):
        row = places.ranks[rank]
        evidence.append(f"rank {rank} peak {row.peak_memory_bytes or 0:.3g} of "
                        f"{row.memory_capacity_bytes or 0:.3g} bytes")
    for key in sorted(obs.gpu_memory):
        g = places.gpu(key)
        evidence.append(f"GPU {key[1]} on {key[0]} at {(g.memory_ratio or 0) if g else 0:.0%}")
    rank = min(obs.rank_memory) if obs.rank_memory else (
        places.rank_of(min(obs.gpu_memory)) if obs.gpu_memory else None)
    return [Finding("memory_pressure", cause_severity("memory_pressure"),
                    f"memory pressure: {evidence[0]}", evidence=tuple(evidence),
                    **where(places, rank))]
