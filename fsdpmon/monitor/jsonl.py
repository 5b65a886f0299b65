"""The JSONL sink: one file per rank, one line per log step, appended and flushed.

``runs/x.jsonl`` becomes ``runs/x.rank0.jsonl``, ``runs/x.rank1.jsonl``, ... Line 1 is the run
record (``"kind": "run"``), then one ``"kind": "step"`` record per log step. Each record goes out
in one ``write`` on an ``O_APPEND`` descriptor, so a crash loses at most the record being
written; a run that appends to a file whose last line a crash cut short (a resumed run) first
removes that fragment, with a warning naming the file and line, so its own header starts a line.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def rank_path(path: str | Path, rank: int) -> Path:
    p = Path(path)
    suffix = p.suffix or ".jsonl"
    return p.with_name(f"{p.stem if p.suffix else p.name}.rank{rank}{suffix}")


class JsonlSink:
    def __init__(self, path: str | Path, rank: int) -> None:
        self.path = rank_path(path, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        cut_torn_tail(self.path, self._fd)

    def write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        data = (json.dumps(_finite(record), separators=(",", ":")) + "\n").encode()
        while data:  # one write in practice; a short one (disk full) is finished, not torn
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def cut_torn_tail(path: Path, fd: int) -> None:
    """Remove a last line that lacks its newline (a crash mid-write), saying which one."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    with open(path, "rb") as fh:
        data = fh.read()
    keep = data.rfind(b"\n") + 1
    line = data.count(b"\n", 0, keep) + 1
    os.truncate(path, keep)
    log.warning("fsdpmon: %s:%d: removed a record cut short by a crash (%d bytes) before "
                "appending", path, line, size - keep)


def _finite(value: Any) -> Any:
    """NaN/Inf are not JSON: written as null (the record's ``loss_nonfinite`` says why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of one rank's file (a torn line is skipped with a warning)."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("fsdpmon: %s:%d: skipped a record cut short by a crash", path,
                            number)
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
