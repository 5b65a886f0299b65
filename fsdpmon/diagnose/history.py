"""The short history of snapshots a live view keeps for the engine (bounded in time)."""

from __future__ import annotations

from collections import deque

from fsdpmon.conventions import (
    CRASH_EVIDENCE_SECONDS,
    DIAGNOSIS_EVIDENCE_SECONDS,
    LOSS_SPIKE_BASELINE_SECONDS,
)
from fsdpmon.job.snapshot import JobSnapshot

# Counter rises (XIDs, ECC, restarts) stay in view this long, as a restarted rank's report of
# its death does, and the loss's recent level before the evidence window; stall and straggler
# evidence needs only DIAGNOSIS_EVIDENCE_SECONDS of it.
HISTORY_SECONDS = max(CRASH_EVIDENCE_SECONDS,
                      LOSS_SPIKE_BASELINE_SECONDS + DIAGNOSIS_EVIDENCE_SECONDS)


class SnapshotHistory:
    def __init__(self, seconds: float = HISTORY_SECONDS) -> None:
        self.seconds = seconds
        self._snaps: deque[JobSnapshot] = deque()

    def push(self, snap: JobSnapshot) -> None:
        if self._snaps and snap.time <= self._snaps[-1].time:
            return  # the same refresh twice (or a clock step back): keep the order
        self._snaps.append(snap)
        while len(self._snaps) > 2 and self._snaps[1].time <= snap.time - self.seconds:
            self._snaps.popleft()

    def snapshots(self) -> list[JobSnapshot]:
        return list(self._snaps)
