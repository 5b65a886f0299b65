"""A run told from its files alone: the ranks' JSONL (``run.rank<R>.jsonl``, as the monitor
writes them; see ``fsdpmon.monitor.flight``) read into incarnations.

Each process of a rank starts its file's next incarnation with a ``run`` record (a restarted
rank appends to the same file), so incarnation k of the job is every rank's k-th ``run``
record and what follows it. Untrusted input: a record without the fields its use needs is
skipped, a directory without rank files is one clear error.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpmon.errors import InputError

RANK_FILE = re.compile(r"\.rank(\d+)\.jsonl$")
MAX_LINE = 1 << 20  # a longer line is not ours


@dataclass
class Incarnation:
    """One process of each rank, from its start to its end."""

    index: int
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> run record
    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # rank -> step records
    events: list[dict[str, Any]] = field(default_factory=list)  # stall, checkpoint, ...

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("kind") == kind]

    @property
    def process_start(self) -> float | None:
        starts = [number(r.get("process_start")) or number(r.get("time"))
                  for r in self.runs.values()]
        known = [s for s in starts if s is not None]
        return min(known) if known else None

    @property
    def last_step(self) -> tuple[float, int] | None:
        """(unix time, step) of the last step record of any rank."""
        ends = [(rec["time"], rec["step"]) for recs in self.steps.values() for rec in recs]
        return max(ends) if ends else None

    def first_begin(self) -> float | None:
        """When the first step began (rank 0's first window, else any rank's)."""
        for rank in sorted(self.steps):
            recs = self.steps[rank]
            if recs:
                return recs[0]["time"] - (number(recs[0].get("window_seconds")) or 0.0)
        return None


@dataclass
class RunLog:
    name: str
    job: str
    ranks: dict[int, dict[str, str]]  # rank -> {"node", "pod"}
    incarnations: list[Incarnation]

    @property
    def world_size(self) -> int:
        sizes = [number(r.get("world_size")) for inc in self.incarnations
                 for r in inc.runs.values()]
        known = [int(s) for s in sizes if s is not None]
        return max(known) if known else max(len(self.ranks), 1)


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if len(line) > MAX_LINE:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line a crash cut short
                if isinstance(record, dict) and number(record.get("time")) is not None:
                    out.append(record)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return out


def rank_files(path: Path) -> dict[int, list[Path]]:
    """A run's per-rank files: those in a directory, those of a JSONL path as the trainer's
    --log-jsonl names it (``x.jsonl``: ``x.rank<R>.jsonl``), or one per-rank file."""
    if path.is_dir():
        candidates = sorted(path.glob("*.jsonl"))
    elif RANK_FILE.search(path.name) and path.is_file():
        candidates = [path]
    else:
        stem = path.name[:-len(path.suffix)] if path.suffix else path.name
        candidates = sorted(path.parent.glob(f"{stem}.rank*.jsonl"))
    found: dict[int, list[Path]] = {}
    for candidate in candidates:
        match = RANK_FILE.search(candidate.name)
        if match:
            found.setdefault(int(match.group(1)), []).append(candidate)
    return found


def load_run(where: str | Path) -> RunLog:
    """The run whose rank files ``where`` names (see ``rank_files``)."""
    files = rank_files(Path(where))
    if not files:
        raise InputError(f"RUN {where}: no per-rank JSONL files (*.rank<N>.jsonl) there")
    return read_run(str(where), files)


def read_run(name: str, files: dict[int, list[Path]]) -> RunLog:
    """A run from its per-rank files (rank -> paths)."""
    incarnations: list[Incarnation] = []
    ranks: dict[int, dict[str, str]] = {}
    job = ""
    for rank, paths in files.items():
        index = -1
        for record in (r for p in paths for r in _records(p)):
            kind = record.get("kind")
            if kind == "run":
                index += 1
                while len(incarnations) <= index:
                    incarnations.append(Incarnation(len(incarnations)))
                incarnations[index].runs[rank] = record
                node = record.get("node")
                ranks[rank] = {"node": node if isinstance(node, str) else "",
                               "pod": str(record.get("pod") or "")}
                job = job or str(record.get("job_name") or "")
            elif index < 0:
                continue  # records before any run record: not ours to place
            elif kind == "step":
                if number(record.get("step")) is not None:
                    incarnations[index].steps.setdefault(rank, []).append(record)
            elif isinstance(kind, str):
                incarnations[index].events.append({**record, "rank": rank})
    return RunLog(name, job or Path(name).name, ranks, incarnations)
