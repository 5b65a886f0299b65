"""What a diagnosis says: findings with a stable cause name, a severity, the culprit's place
(rank, pod, node, GPU) and the evidence, ranked most urgent first.

Plain data; the cause names are a public interface (alerts, the runbook's sections, scripts
reading `fsdpmon diagnose --json`), so they never change once released.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, TypedDict

from fsdpmon.conventions import Severity, cause_severities
from fsdpmon.diagnose.observe import GpuKey, Observations, Places
from fsdpmon.diagnose.stacks import StackClass
from fsdpmon.job.snapshot import RankRow

# Most urgent first within a severity: causes that stop the job, then GPU faults, then what
# slows it, then what only threatens it.
CAUSES = (
    "hang", "collective_desync", "rank_unresponsive", "rank_missing", "crash_loop", "gpu_lost",
    "gpu_xid", "gpu_ecc",
    "loss_nonfinite", "gpu_throttled", "straggler_compute", "straggler_data",
    "host_cpu_contention", "cpu_throttled", "checkpoint_slow", "memory_pressure", "loss_spike",
    "training_unstable", "target_down",
)
# The causes that name the rank the others wait for (a straggler, and why it is slow): the
# stretches goodput charges straggler time to, and the straggler incidents.
SLOWDOWN_CAUSES = ("gpu_throttled", "straggler_compute", "straggler_data", "host_cpu_contention",
                   "cpu_throttled")
# The causes about what the job learns, not how fast: incidents of their own (a spike that is
# over before anyone looks is still one), replayed from the loss and grad norm each step logged.
QUALITY_CAUSES = ("loss_spike", "training_unstable")

NEXT_STEPS = {
    "collective_desync": "the ranks called different collectives: look at the call site in the "
                         "evidence (a collective under `if rank == ...` or a data-dependent "
                         "branch) on the named rank; `py-spy dump --pid <pid>` in {pod}; "
                         "restart from the last checkpoint once fixed",
    "hang": "look at the odd rank first: `kubectl logs {pod}`, then `py-spy dump --pid <pid>` "
            "in its pod; restart from the last checkpoint once its cause is known",
    "rank_unresponsive": "the process is stopped or holds the GIL: `kubectl exec {pod} -- "
                         "py-spy dump --pid <pid>`; check `kubectl describe pod {pod}` for OOM "
                         "or eviction",
    "rank_missing": "its process is gone: `kubectl describe pod {pod}` and `kubectl logs {pod} "
                    "--previous` for the exit reason (OOMKilled, error, node lost)",
    "crash_loop": "the job keeps restarting: `kubectl logs {pod} --previous` for the first "
                  "failure; fix it before the restart budget runs out",
    "gpu_lost": "cordon and drain {node} (`kubectl cordon {node}`), replace the instance; the "
                "job restarts on a healthy node from its last checkpoint",
    "gpu_xid": "look the XID up in NVIDIA's XID catalogue; for 48/63/64/74/79/94/95 cordon and "
               "drain {node} and replace the instance",
    "gpu_ecc": "uncorrected memory errors: cordon and drain {node}; reset or replace GPU {gpu} "
               "before scheduling work on it again",
    "loss_nonfinite": "stop and resume from the last good checkpoint with a lower learning rate "
                      "or gradient clipping; check the batch that produced it",
    "gpu_throttled": "check cooling and power on {node} (`nvidia-smi -q -d PERFORMANCE` in the "
                     "exporter pod); replace the instance if it persists",
    "straggler_compute": "compare {node} with its peers (GPU clocks, other processes); cordon "
                         "it and restart the job elsewhere if it stays slow",
    "straggler_data": "the rank waits for its data: check the data loader workers, dataset "
                      "storage (FSx/S3) throughput and CPU limits of {pod}",
    "host_cpu_contention": "the rank waits for a CPU: other work shares its cores on {node}; "
                           "give {pod} a CPU request equal to its limit (Guaranteed QoS, "
                           "static CPU manager), fewer data loader workers, or move other pods "
                           "off {node}",
    "cpu_throttled": "{pod}'s CPU limit throttles it: raise the limit (or remove it and keep "
                     "the request), or use fewer data loader workers and sidecar threads; "
                     "`kubectl top pod {pod} --containers`",
    "checkpoint_slow": "checkpoint writes are slow: check the storage (FSx/EBS throughput), "
                       "use async checkpointing, or checkpoint less often",
    "memory_pressure": "close to out-of-memory: lower the micro-batch, enable activation "
                       "checkpointing or CPU offload before it OOMs",
    "loss_spike": "watch the next windows; if it does not come back, resume from the checkpoint "
                  "before the spike with a lower learning rate",
    "training_unstable": "the grad norm jumped and stays high: lower the learning rate or "
                         "clip gradients harder; look at the data of the steps since it rose "
                         "and be ready to resume from the checkpoint before it",
    "target_down": "a scrape target stopped answering: `kubectl get pod {pod} -o wide`; check "
                   "the exporter DaemonSet and the network policy",
}


@dataclass(frozen=True)
class Finding:
    cause: str
    severity: Severity
    summary: str  # one line in words: the header's line
    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    gpu: str | None = None
    evidence: tuple[str, ...] = ()
    stacks: tuple[StackClass, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:  # "critical" and Severity.CRITICAL are one severity
        object.__setattr__(self, "severity", Severity(self.severity))
        # one severity per cause, the alerts' too (conventions.CAUSE_SEVERITY): a rule that
        # strays from it is a bug for the tests to catch, not a verdict to print
        if self.severity not in cause_severities(self.cause):
            allowed = sorted(s.value for s in cause_severities(self.cause))
            raise ValueError(f"{self.cause} is {allowed} in conventions.CAUSE_SEVERITY, "
                             f"not {self.severity.value}")

    @property
    def next_step(self) -> str:
        return NEXT_STEPS[self.cause].format(pod=self.pod or "<pod>", node=self.node or "<node>",
                                             gpu=self.gpu or "<gpu>")

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "severity": self.severity.value, "rank": self.rank,
                "pod": self.pod, "node": self.node, "gpu": self.gpu,
                "evidence": list(self.evidence), "next_step": self.next_step,
                "summary": self.summary, "stacks": [c.to_dict() for c in self.stacks]}


def ranked(findings: list[Finding]) -> list[Finding]:
    """Critical before warning, then by cause (causes that stop the job first), then rank."""
    return sorted(findings, key=lambda f: (f.severity is not Severity.CRITICAL,
                                           CAUSES.index(f.cause),
                                           -1 if f.rank is None else f.rank, f.node or "",
                                           f.gpu or ""))


def ranks_text(ranks: list[int] | tuple[int, ...], limit: int = 8) -> str:
    """'rank 3' / 'ranks 1, 2, 5 (+40 more)'."""
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f" (+{len(ranks) - limit} more)" if len(ranks) > limit else ""
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{more}"


@dataclass(frozen=True)
class Verdict:
    """The findings now, and how much history they were drawn from (a live view says it is
    still gathering evidence while ``seconds`` < ``span_s``); ``glance``: what the newest
    refresh shows that has not held for ``span_s`` yet (fsdpmon.diagnose.glance), the header's
    lines before a finding confirms them and all that one refresh (`top --once`) can say."""

    findings: tuple[Finding, ...] = ()
    seconds: float = 0.0
    span_s: float = 0.0
    glance: tuple[Finding, ...] = ()

    @property
    def critical(self) -> tuple[Finding, ...]:
        """The critical findings, confirmed first, then those at a glance."""
        return tuple(f for f in (*self.findings, *self.glance)
                     if f.severity is Severity.CRITICAL)

    @property
    def gathering(self) -> bool:
        return self.seconds < self.span_s


# Where a finding's culprit is (rank, pod, node, GPU) and which stalled ranks it explains.


class Where(TypedDict):
    rank: int | None
    pod: str | None
    node: str | None
    gpu: str | None


def where(places: Places, rank: int | None, gpu: GpuKey | None = None) -> Where:
    """The culprit's place: its rank, pod and node, and the GPU it runs on."""
    row = places.rank(rank)
    gpu = gpu or (places.gpu_of(rank) if rank is not None else None)
    return {"rank": rank, "pod": (row.pod if row else None) or None,
            "node": (row.node if row else None) or (gpu[0] if gpu else None),
            "gpu": gpu[1] if gpu else None}


def waiters(obs: Observations, culprits: set[int]) -> list[str]:
    """The stalled ranks a culprit explains, taken out of the observations as evidence."""
    waiting = sorted(obs.stalled - culprits)
    obs.stalled -= set(waiting) | culprits
    return [f"{len(waiting)} other {ranks_text(waiting)} stalled waiting for it"] if waiting else []


def median(values: list[float]) -> float:
    """The median, 0.0 of nothing."""
    return statistics.median(values) if values else 0.0


def age(row: RankRow | None) -> str:
    if row is None or row.heartbeat_age_s is None:
        return ""
    return f"; no step for {row.heartbeat_age_s:.0f}s (threshold {row.stall_threshold_s or 0:.0f}s)"


def where_all(places: Places, ranks: list[int], rank: int | None) -> Where:
    """The place of one culprit rank; of several, the pod and node they share, if any."""
    if rank is not None:
        return where(places, rank)
    rows = [places.ranks[r] for r in ranks if r in places.ranks]
    pods, nodes = {r.pod for r in rows}, {r.node for r in rows}
    return {"rank": None, "pod": pods.pop() or None if len(pods) == 1 else None,
            "node": nodes.pop() or None if len(nodes) == 1 else None, "gpu": None}
