"""What `top` reads in the demo: the two endpoints, plus what only the demo knows.

- Its own log files feed the Logs view (a local log source beside the Kubernetes one): the
  training's (torchrun's output, every rank's lines tagged `[rankN]`) and the exporter's.
- The Processes view lists only the demo's processes, not everything else on the machine.
- How torchrun ended is the job's own status, as a PyTorchJob's conditions are on a cluster:
  exit 0 is Succeeded (DONE), anything else Failed with the status as its reason.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from fsdpmon.job.health import with_conditions
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.sources.targets import TargetsSource

KEEP_LINES = 500  # the latest lines of the followed log kept for the view
READ_LIMIT = 1 << 20  # a refresh reads at most this much new log text


class LocalLogs:
    """Tails one of several local log files at a time, reading only what was appended."""

    def __init__(self, files: Sequence[tuple[str, Path]]) -> None:
        self.files = list(files)
        self.index = 0
        self._offset = 0
        self._partial = b""
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)

    def follow(self, which: int | str | None) -> None:
        """The ``which``-th file (the Logs view's `[ ]`); a name or None keeps the current one
        (the demo's ranks share the training log)."""
        if isinstance(which, int):
            index = min(max(0, which), len(self.files) - 1)
            if index != self.index:
                self.index, self._offset, self._partial = index, 0, b""
                self.lines.clear()

    def read(self) -> tuple[str, tuple[str, ...]]:
        name, path = self.files[self.index]
        try:
            with open(path, "rb") as fh:
                if os.fstat(fh.fileno()).st_size < self._offset:  # truncated: start over
                    self._offset, self._partial = 0, b""
                    self.lines.clear()
                fh.seek(self._offset)
                data = fh.read(READ_LIMIT)
        except OSError:
            return name, tuple(self.lines)
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        self.lines.extend(line.decode("utf-8", "replace").rstrip("\r") for line in complete)
        return name, tuple(self.lines)


class DemoSource:
    """A TargetsSource on the demo's endpoints, narrowed and completed by what the demo knows."""

    def __init__(self, urls: Sequence[str], job_name: str, log_dir: Path,
                 pids: Callable[[], set[int]], exit_code: Callable[[], int | None]) -> None:
        self.inner = TargetsSource(urls, timeout_s=2.0, job_name=job_name)
        self.logs = LocalLogs([("training (train.log)", log_dir / "train.log"),
                               ("exporter (exporter.log)", log_dir / "exporter.log")])
        self._pids, self._exit_code = pids, exit_code
        self.log_dir = log_dir

    @property
    def description(self) -> str:
        return self.inner.description

    @property
    def notice(self) -> str:
        return str(getattr(self.inner, "notice", ""))

    def fetch(self) -> JobSnapshot:
        snap = self.inner.fetch()
        mine = self._pids()
        name, lines = self.logs.read()
        snap = replace(snap, processes=tuple(p for p in snap.processes if p.pid in mine),
                       log_pod=name, logs=lines)
        code = self._exit_code()
        if code == 0:
            return with_conditions(snap, [{"type": "Succeeded", "status": "True"}])
        if code is not None:
            return with_conditions(snap, [{
                "type": "Failed", "status": "True", "reason": "TorchrunFailed",
                "message": f"torchrun exited with status {code}; see "
                           f"{self.log_dir / 'train.log'}"}])
        return snap

    def showing(self, view: str, processes: bool = False) -> None:
        self.inner.showing(view, processes)

    def follow_logs(self, which: int | str | None) -> None:
        self.logs.follow(which)

    def close(self) -> None:
        self.inner.close()
