"""The frozen job snapshot every source builds and every view renders.

A snapshot is plain data: no I/O handles, no clients. ``to_dict()`` is the body of `--json`'s
output (`top --json`, `demo --headless --json`), whose shape these dataclasses document (field
names are the keys); the command adds ``findings``, the diagnosis of that refresh.

Its properties state facts, not verdicts: which ranks are stalled, gone or never seen, which
targets and GPUs are down, which rank the monitor flags as a straggler. The job's state
(fsdpmon.job.health) follows from them; diagnose names them (fsdpmon.diagnose.glance).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from fsdpmon.conventions import MEMORY_PRESSURE_RATIO


class JobState(str, Enum):
    RUNNING = "RUNNING"  # every target answers, no rank stalled, nothing alarming
    DEGRADED = "DEGRADED"  # still training, but a target is down, a rank straggles, memory is tight
    STALLED = "STALLED"  # at least one rank has not completed a step within its stall threshold
    DONE = "DONE"  # every rank reached its last step (or the job said it succeeded)
    FAILED = "FAILED"  # ranks went away before their last step and did not come back
    RESTARTING = "RESTARTING"  # the elastic agent (or the operator) is restarting the ranks
    DOWN = "DOWN"  # no target answered: nothing is known about the job


@dataclass(frozen=True)
class TargetStatus:
    url: str
    kind: str  # "train", "exporter" or "unknown" (before anything was read from it)
    up: bool
    error: str = ""
    duration_s: float = 0.0
    samples: int = 0
    pod: str = ""
    node: str = ""


@dataclass(frozen=True)
class RankRow:
    rank: int
    local_rank: int | None = None
    pod: str = ""
    node: str = ""
    step: int | None = None
    step_time_s: float | None = None
    data_wait_ratio: float | None = None
    tokens_per_second: float | None = None
    mfu_ratio: float | None = None
    loss: float | None = None
    grad_norm: float | None = None  # the job's, as this rank computed it (one global norm)
    peak_memory_bytes: float | None = None
    memory_capacity_bytes: float | None = None
    heartbeat_age_s: float | None = None
    stall_threshold_s: float | None = None
    stalled: bool = False
    slowest: bool = False
    busy_s: float | None = None  # mean per-step time not waiting in collectives
    collective_wait_ratio: float | None = None
    straggler_score: float | None = None  # median busy / own busy; low = straggler
    straggling: bool | None = None  # the monitor's persistent verdict (None: not published)
    waited_for_score: float | None = None  # the others' median held time / own; low: waited for
    descheduled_ratio: float | None = None  # share of its step waiting for a CPU
    cpu_throttled_ratio: float | None = None  # share of its cgroup's CFS periods throttled
    unresponsive: bool = False  # its monitor thread stopped: the rank that hangs
    # Progress evidence (None: not published): the last collective it entered, and whether it
    # is inside one now; a stalled job's rank behind the others', or outside while they wait
    # inside, is the one they wait for.
    collective_entered: int | None = None
    in_collective: bool | None = None
    # Collective identity (None: not published): the last completed step's calls, their
    # fingerprint and the sequence number at its end; the entered call's op and dtype codes
    # (fsdpmon.conventions.OPS / DTYPE_NAMES, from 1), elements, and whether it breaks
    # the rank's own pattern of the step before. Ranks that differ made different calls.
    step_collectives: int | None = None
    step_fingerprint: int | None = None
    step_end_seq: int | None = None
    entered_op: int | None = None
    entered_elements: int | None = None
    entered_dtype: int | None = None
    entered_off_pattern: bool | None = None
    # Its last pattern break (None: none published): the step, the position in it (from 1) and
    # the codes of its first call off the pattern (op None: the step ended there, a call
    # short), of the step before's call there (op None: the call was past its end), and the
    # call site ('train.py:123 in train_step'; '' unknown).
    break_step: int | None = None
    break_index: int | None = None
    break_op: int | None = None
    break_elements: int | None = None
    break_dtype: int | None = None
    break_expected_op: int | None = None
    break_expected_elements: int | None = None
    break_expected_dtype: int | None = None
    break_site: str = ""
    loss_nonfinite: bool = False
    # the first step its loss / grad norm was NaN or infinite (None: not yet)
    loss_first_nonfinite_step: int | None = None
    grad_norm_first_nonfinite_step: int | None = None
    checkpoint_seconds: float | None = None  # the last save's wall time
    checkpoint_own_seconds: float | None = None  # of which not waiting for other ranks
    checkpoint_time_ratio: float | None = None  # the last save's share of wall time
    restarts: int | None = None
    # How its previous incarnation ended (a restarted rank says: killed, sigterm, error,
    # exit; "" on a first start), at which step and when.
    previous_exit: str = ""
    previous_exit_step: int | None = None
    previous_exit_unix: float | None = None
    gpus: tuple[str, ...] = ()  # "node/gpu" of the GPUs its process holds (exporter's NVML view)
    down: bool = False  # its series vanished or its target stopped answering; last figures kept
    seen_at: float | None = None  # when a refresh last found it
    gone_at: float | None = None  # the first refresh that did not
    finished: bool = False  # gone after (or at) its last step: DONE, not DOWN
    target: str = ""  # the URL its series came from

    @property
    def flags(self) -> str:
        marks = []
        if self.down:
            marks.append("DONE" if self.finished else "DOWN")
        if self.stalled:
            marks.append("STALLED")
        if self.slowest:
            marks.append("SLOWEST")
        return " ".join(marks)


# The values a sparkline shows (the header's figures, a GPU's utilization), and so all of a
# GPU's history its row keeps: a longer history would be copied for every GPU of a large job
# at every refresh, for values no view shows.
SPARK_WIDTH = 10


@dataclass(frozen=True)
class GpuRow:
    node: str
    gpu: str
    model: str = ""
    uuid: str = ""
    up: bool = True
    utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    namespace: str = ""
    pod: str = ""
    container: str = ""
    clock_events: tuple[str, ...] = ()  # active clock-event (throttle) reasons
    xid_counts: tuple[tuple[str, float], ...] = ()  # (XID code, count since driver load)
    ecc_uncorrected: float | None = None  # uncorrected ECC errors since driver load
    ranks: tuple[int, ...] = ()  # training ranks whose processes hold this GPU
    utilization_history: tuple[float, ...] = ()  # the last SPARK_WIDTH refreshes

    @property
    def memory_ratio(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True)
class NodeRow:
    node: str
    gpus: int = 0
    cpu_utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    load1: float | None = None
    simulated: bool = False


@dataclass(frozen=True)
class ProcessRow:
    node: str
    pid: int
    namespace: str = ""
    pod: str = ""
    container: str = ""
    command: str = ""
    user: str = ""
    state: str = ""
    cpu_ratio: float | None = None  # in cores: 1.0 = one core busy
    rss_bytes: float | None = None
    gpu_memory_bytes: float | None = None
    gpus: tuple[str, ...] = ()  # the GPUs (indices on its node) it holds memory on
    gpu_simulated: bool = False  # those GPUs are the exporter's simulated ones (marked SIM)
    rank: int | None = None  # RANK of a torchrun worker, from its environment


@dataclass(frozen=True)
class History:
    """Recent header figures, oldest first, for sparklines."""

    tokens_per_second: tuple[float, ...] = ()
    loss: tuple[float, ...] = ()
    step_time_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class JobSnapshot:
    time: float
    source: str
    job_name: str = ""
    state: JobState = JobState.DOWN
    step: int | None = None
    total_steps: int | None = None
    world_size: int | None = None
    tokens_per_second: float | None = None
    mfu_ratio: float | None = None
    step_time_median_s: float | None = None
    step_time_max_s: float | None = None
    loss: float | None = None
    eta_s: float | None = None
    restarts: int | None = None
    slowest_rank: int | None = None
    goodput_ratio: float | None = None  # rank 0's share of kept step time so far
    model: str = ""
    ranks: tuple[RankRow, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    nodes: tuple[NodeRow, ...] = ()
    processes: tuple[ProcessRow, ...] = ()
    targets: tuple[TargetStatus, ...] = ()
    history: History = field(default_factory=History)
    logs: tuple[str, ...] = ()
    log_pod: str = ""
    reason: str = ""  # why the job is in its state, when its own status says (Kubernetes)

    @property
    def progress(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return min(1.0, self.step / self.total_steps)

    @property
    def targets_up(self) -> int:
        return sum(1 for t in self.targets if t.up)

    def unseen_ranks(self, limit: int = 64) -> tuple[int, ...]:
        """Ranks below the world size that no row names, the first ``limit`` of them.

        The world size is what the pods say (untrusted: a pod may claim 10^18 ranks), so this
        walks at most len(ranks) + ``limit`` numbers instead of building range(world_size)."""
        if not self.world_size or self.world_size <= 0:
            return ()
        seen = {r.rank for r in self.ranks}
        out: list[int] = []
        for rank in range(self.world_size):
            if rank not in seen:
                out.append(rank)
                if len(out) >= limit:
                    break
        return tuple(out)

    @property
    def stalled_ranks(self) -> tuple[int, ...]:
        """Live ranks past their stall threshold (the monitor's heartbeat verdict)."""
        return tuple(r.rank for r in self.ranks if r.stalled and not r.down)

    @property
    def gone_ranks(self) -> tuple[RankRow, ...]:
        """Ranks that went away before their last step (not ``finished``)."""
        return tuple(r for r in self.ranks if r.down and not r.finished)

    @property
    def down_targets(self) -> tuple[TargetStatus, ...]:
        """Targets not answering, but for the training endpoints of ranks that finished (a
        finished job's endpoints go away with it)."""
        down = [t for t in self.targets if not t.up]
        if not down:
            return ()
        done = {r.target for r in self.ranks if r.finished} - {
            r.target for r in self.ranks if not r.finished}
        return tuple(t for t in down if t.url not in done)

    @property
    def lost_gpus(self) -> tuple[GpuRow, ...]:
        """GPUs not seen up: NVML says so, or their exporter stopped answering."""
        return tuple(g for g in self.gpus if not g.up)

    @property
    def flagged_straggler(self) -> RankRow | None:
        """The live rank flagged SLOWEST with a straggler score: the monitor's persistent
        verdict (or the score against the line where it publishes none), see mark_slowest."""
        return next((r for r in self.ranks if r.slowest and not r.down
                     and r.straggler_score is not None), None)

    @property
    def tight_ranks(self) -> tuple[int, ...]:
        """Live ranks whose peak device memory reached MEMORY_PRESSURE_RATIO of capacity."""
        return tuple(r.rank for r in self.ranks if not r.down and r.peak_memory_bytes
                     and r.memory_capacity_bytes
                     and r.peak_memory_bytes / r.memory_capacity_bytes >= MEMORY_PRESSURE_RATIO)

    @property
    def tight_gpus(self) -> tuple[GpuRow, ...]:
        """GPUs up with MEMORY_PRESSURE_RATIO of their memory or more in use."""
        return tuple(g for g in self.gpus if g.up and (ratio := g.memory_ratio) is not None
                     and ratio >= MEMORY_PRESSURE_RATIO)

    @property
    def nonfinite_ranks(self) -> tuple[int, ...]:
        """Live ranks whose loss is NaN or infinite (as served, or flagged by the monitor)."""
        return tuple(r.rank for r in self.ranks if not r.down and (
            r.loss_nonfinite or (r.loss is not None and not math.isfinite(r.loss))))

    def to_dict(self) -> dict[str, Any]:
        data = _plain(dataclasses.asdict(self))
        data["progress"] = self.progress
        return data

    def to_json(self, indent: int | None = 2) -> str:
        """The snapshot as strict JSON (NaN and infinities become null)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
