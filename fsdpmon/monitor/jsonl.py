"""The JSONL sink: one file per rank, one line per log step, appended and flushed.

``runs/x.jsonl`` becomes ``runs/x.rank0.jsonl``, ``runs/x.rank1.jsonl``, ... Line 1 is the run
record (``"kind": "run"``), then one ``"kind": "step"`` record per log step. A crash loses at most
the line being written; readers skip a torn last line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TextIO


def rank_path(path: str | Path, rank: int) -> Path:
    p = Path(path)
    suffix = p.suffix or ".jsonl"
    return p.with_name(f"{p.stem if p.suffix else p.name}.rank{rank}{suffix}")


class JsonlSink:
    def __init__(self, path: str | Path, rank: int) -> None:
        self.path = rank_path(path, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        self._fh.write(json.dumps(_finite(record), separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


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
    """Every complete record of one rank's file (a torn last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
