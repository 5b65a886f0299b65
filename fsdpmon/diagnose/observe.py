"""What the history shows, before any cause is chosen: each fact held over the evidence window
(stalled, unresponsive and missing ranks, lost and throttled GPUs, stragglers, ...), and the
ties between a GPU and the rank it serves. Pure functions of the snapshots.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from fsdpmon.conventions import (
    CHECKPOINT_SHARE_LIMIT,
    CPU_THROTTLED_RATIO,
    CRASH_EVIDENCE_SECONDS,
    GPU_POWER_CAP_REASON,
    GPU_THROTTLE_REASONS,
    HOST_CPU_BUSY_RATIO,
    STRAGGLER_CAUSE_SHARE,
    below_straggler_line,
)
from fsdpmon.diagnose.spike import Spike, loss_spike
from fsdpmon.diagnose.unstable import Unstable, grad_norm_unstable
from fsdpmon.diagnose.window import Window
from fsdpmon.job.snapshot import GpuRow, JobSnapshot, RankRow

GpuKey = tuple[str, str]  # (node, gpu index)


def _live(snap: JobSnapshot) -> list[RankRow]:
    return [r for r in snap.ranks if not r.down]


def _stalled(snap: JobSnapshot) -> tuple[int, ...]:
    return snap.stalled_ranks


def _unresponsive(snap: JobSnapshot) -> list[int]:
    return [r.rank for r in snap.ranks if r.unresponsive and not r.down]


def _missing(snap: JobSnapshot) -> list[int]:
    """Ranks that went away before their last step, and ranks of the world size that never
    reported at all (a rank gone after its last step finished: DONE, nothing is missing)."""
    return sorted({r.rank for r in snap.gone_ranks} | set(snap.unseen_ranks()))


def _lost(snap: JobSnapshot) -> list[GpuKey]:
    """GPUs their exporter reports down (an exporter that does not answer says nothing)."""
    unheard = {t.node for t in snap.targets if not t.up}
    return [(g.node, g.gpu) for g in snap.lost_gpus if g.node not in unheard]


def _throttled(snap: JobSnapshot) -> list[tuple[GpuKey, str]]:
    return [((g.node, g.gpu), reason) for g in snap.gpus if g.up
            for reason in g.clock_events if reason in GPU_THROTTLE_REASONS]


def _power_capped(snap: JobSnapshot) -> list[GpuKey]:
    return [(g.node, g.gpu) for g in snap.gpus if g.up and GPU_POWER_CAP_REASON in g.clock_events]


def _stragglers(snap: JobSnapshot) -> list[int]:
    return [r.rank for r in _live(snap) if below_straggler_line(r.straggler_score)]


def _starved(snap: JobSnapshot) -> list[int]:
    """Ranks the others wait for (waited-for score below the line) that are not busier than
    them (straggler score not below it) and wait for a CPU more than the others' median: the
    time the others wait for is this rank waiting for a CPU."""
    live = _live(snap)
    out = []
    for r in live:
        waited, own = r.waited_for_score, r.descheduled_ratio
        if waited is None or own is None or not below_straggler_line(waited):
            continue
        if below_straggler_line(r.straggler_score):
            continue  # busy: a compute or data straggler
        others = [o.descheduled_ratio for o in live if o is not r and o.descheduled_ratio
                  is not None]
        if others and own > statistics.median(others):
            out.append(r.rank)
    return out


def cpu_throttled(window: Window, ranks: set[int]) -> dict[int, float]:
    """Of ``ranks``, those whose cgroup was throttled in CPU_THROTTLED_RATIO of its CFS periods
    or more, as the median over the window's snapshots (one log window holds few periods),
    with that median: the evidence shows the share judged, not the newest sample's."""
    out = {}
    for rank in ranks:
        shares = [r.cpu_throttled_ratio for s in window.recent for r in s.ranks
                  if r.rank == rank and r.cpu_throttled_ratio is not None]
        if shares and (share := statistics.median(shares)) >= CPU_THROTTLED_RATIO:
            out[rank] = share
    return out


def _nonfinite(snap: JobSnapshot) -> tuple[int, ...]:
    return snap.nonfinite_ranks


def _rank_memory(snap: JobSnapshot) -> tuple[int, ...]:
    return snap.tight_ranks


def _gpu_memory(snap: JobSnapshot) -> list[GpuKey]:
    return [(g.node, g.gpu) for g in snap.tight_gpus]


def _busy_nodes(snap: JobSnapshot) -> list[str]:
    return [n.node for n in snap.nodes if n.cpu_utilization_ratio is not None
            and n.cpu_utilization_ratio >= HOST_CPU_BUSY_RATIO]


def _checkpoint_heavy(snap: JobSnapshot) -> list[str]:
    """["job"] while the median rank's last save took CHECKPOINT_SHARE_LIMIT of the wall time
    (since the save before it)."""
    shares = [r.checkpoint_time_ratio for r in _live(snap) if r.checkpoint_time_ratio is not None]
    heavy = bool(shares) and statistics.median(shares) >= CHECKPOINT_SHARE_LIMIT
    return ["job"] if heavy else []


def _checkpoint_holdups(snap: JobSnapshot) -> list[int]:
    """Ranks the others waited for in the last save: own save work (not waiting for peers)
    above the other ranks' median by STRAGGLER_CAUSE_SHARE of the save's wall time or more."""
    saved = [r for r in _live(snap) if r.checkpoint_own_seconds is not None
             and r.checkpoint_seconds]
    out = []
    for r in saved:
        others = [o.checkpoint_own_seconds or 0.0 for o in saved if o is not r]
        if others and (r.checkpoint_own_seconds or 0.0) - statistics.median(others) >= (
                STRAGGLER_CAUSE_SHARE * (r.checkpoint_seconds or 0.0)):
            out.append(r.rank)
    return out


def _targets_down(snap: JobSnapshot) -> list[str]:
    return [t.url for t in snap.down_targets]


def _xids(snap: JobSnapshot) -> dict[tuple[str, str, str], float]:
    return {(g.node, g.gpu, code): n for g in snap.gpus for code, n in g.xid_counts}


def _ecc(snap: JobSnapshot) -> dict[GpuKey, float]:
    return {(g.node, g.gpu): g.ecc_uncorrected for g in snap.gpus
            if g.ecc_uncorrected is not None}


def _restarts(snap: JobSnapshot) -> dict[str, float]:
    return {"job": float(snap.restarts)} if snap.restarts is not None else {}


def _exits(snap: JobSnapshot) -> dict[int, tuple[str, int | None]]:
    """rank → (how, step) for ranks whose previous incarnation ended within
    CRASH_EVIDENCE_SECONDS, as their restarted processes reported it (rows of ranks gone since
    keep what they said)."""
    return {r.rank: (r.previous_exit, r.previous_exit_step) for r in snap.ranks
            if r.previous_exit and r.previous_exit_unix is not None
            and snap.time - r.previous_exit_unix <= CRASH_EVIDENCE_SECONDS}


@dataclass
class Observations:
    """Facts that held over the window; findings consume them, so each is explained once."""

    now: JobSnapshot
    seconds: float
    stalled: set[int] = field(default_factory=set)
    unresponsive: set[int] = field(default_factory=set)
    missing: set[int] = field(default_factory=set)
    missing_since: dict[int, float] = field(default_factory=dict)
    lost: set[GpuKey] = field(default_factory=set)
    throttled: dict[GpuKey, list[str]] = field(default_factory=dict)
    power_capped: set[GpuKey] = field(default_factory=set)
    stragglers: set[int] = field(default_factory=set)
    starved: set[int] = field(default_factory=set)  # waited for, not busy: waiting for a CPU
    # Of them, those held back by a CPU limit, with their median throttled share.
    cpu_throttled: dict[int, float] = field(default_factory=dict)
    nonfinite: set[int] = field(default_factory=set)
    rank_memory: set[int] = field(default_factory=set)
    gpu_memory: set[GpuKey] = field(default_factory=set)
    busy_nodes: set[str] = field(default_factory=set)
    targets_down: set[str] = field(default_factory=set)
    xids: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)
    ecc: dict[GpuKey, tuple[float, float]] = field(default_factory=dict)
    restarts: tuple[float, float] | None = None
    # How each rank's previous incarnation ended, when it did recently: a record, not a
    # sample, so it is read from the newest snapshot.
    exits: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    loss_spike: Spike | None = None
    unstable: Unstable | None = None  # the job's grad norm held well above its recent level
    checkpoint_heavy: bool = False
    checkpoint_holdups: set[int] = field(default_factory=set)


def observe(window: Window) -> Observations:
    obs = Observations(now=window.now, seconds=window.seconds)
    if not window.covered:
        return obs
    obs.stalled = window.lasting(_stalled)
    obs.unresponsive = window.lasting(_unresponsive)
    obs.missing = window.lasting(_missing)
    # when each went (the culprits are the first to go): only asked of ranks missing now, and
    # it reads the whole history, so not asked of a job with none (a replay asks every step)
    obs.missing_since = window.first_seen(_missing) if obs.missing else {}
    obs.lost = window.lasting(_lost)
    for key, reason in window.lasting(_throttled):
        obs.throttled.setdefault(key, []).append(reason)
    obs.power_capped = window.lasting(_power_capped)
    obs.stragglers = window.lasting(_stragglers)
    obs.starved = window.lasting(_starved)
    obs.cpu_throttled = cpu_throttled(window, obs.starved)
    obs.nonfinite = window.lasting(_nonfinite)
    obs.rank_memory = window.lasting(_rank_memory)
    obs.gpu_memory = window.lasting(_gpu_memory)
    obs.busy_nodes = window.lasting(_busy_nodes)
    obs.targets_down = window.lasting(_targets_down)
    obs.xids = window.rise(_xids)
    obs.ecc = window.rise(_ecc)
    # while every rank is gone (the agent restarting them) no restart count is known, not 0
    obs.restarts = window.rise(_restarts, absent=None).get("job")
    obs.exits = _exits(window.now)
    obs.loss_spike = loss_spike(window)
    obs.unstable = grad_norm_unstable(window)
    obs.checkpoint_heavy = bool(window.lasting(_checkpoint_heavy))
    obs.checkpoint_holdups = window.lasting(_checkpoint_holdups)
    return obs


class Places:
    """Where ranks and GPUs are, and which GPU serves which rank: the exporter's tie (the
    worker process NVML lists on the GPU, with its RANK) from the latest snapshot that had one,
    since a lost GPU lists no processes; else by node and local rank (one process per GPU,
    LOCAL_RANK = device index, as torchrun and the PyTorchJob run them)."""

    def __init__(self, history: Sequence[JobSnapshot]) -> None:
        snap = history[-1]
        self.ranks = {r.rank: r for r in snap.ranks}
        self.gpus = {(g.node, g.gpu): g for g in snap.gpus}
        self._rank_of: dict[GpuKey, int] = {}
        by_pod = {(g.pod, g.gpu): (g.node, g.gpu) for g in snap.gpus if g.pod}
        for r in snap.ranks:
            if r.local_rank is None:
                continue
            key = (r.node, str(r.local_rank))
            if key not in self.gpus:
                key = by_pod.get((r.pod, str(r.local_rank)), key)
            if key in self.gpus:
                self._rank_of[key] = r.rank
        tied: set[GpuKey] = set()
        for old in reversed(history):  # newest first: the latest tie wins
            for g in old.gpus:
                key = (g.node, g.gpu)
                if len(g.ranks) == 1 and key not in tied and key in self.gpus:
                    self._rank_of[key] = g.ranks[0]
                    tied.add(key)
            if len(tied) == len(self.gpus):
                break
        self._gpu_of = {rank: key for key, rank in self._rank_of.items()}

    def rank_of(self, gpu: GpuKey) -> int | None:
        return self._rank_of.get(gpu)

    def gpu_of(self, rank: int) -> GpuKey | None:
        return self._gpu_of.get(rank)

    def rank(self, rank: int | None) -> RankRow | None:
        return None if rank is None else self.ranks.get(rank)

    def gpu(self, key: GpuKey) -> GpuRow | None:
        return self.gpus.get(key)
