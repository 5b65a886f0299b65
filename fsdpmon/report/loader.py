"""Read a run's JSONL logs (one file per rank) into a :class:`RunData`.

A RUN argument may be the trainer's ``--log-jsonl PATH`` (the per-rank files ``PATH.rank<k>.jsonl``
sit next to it), one of those per-rank files, or a directory holding one or more runs' files.
Anything unreadable becomes an :class:`InputError` that names the file (and line).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.errors import InputError
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import read_run
from fsdpmon.report.model import RunData, Sample

_RANK_FILE = re.compile(r"^(?P<base>.+)\.rank(?P<rank>\d+)(?P<ext>\.[^.]*)?$")
_STEP_NUMBERS = ("time", "step", "tokens_per_second", "step_time_s", "tokens_total")

log = logging.getLogger(__name__)


def load_runs(arguments: list[str]) -> list[RunData]:
    """Every run named by the command-line RUN arguments, in the order given."""
    found = [item for argument in arguments for item in _resolve(Path(argument))]
    labels = [_label(source) for source, _ in found]
    runs = []
    for (source, files), label in zip(found, labels, strict=True):
        unique = labels.count(label) == 1
        runs.append(load_run(label if unique else source, files, source=source))
    return runs


def _label(source: str) -> str:
    """``runs/n2.jsonl`` -> ``n2``: what a table row and a chart need to say."""
    return Path(source).name.removesuffix(".jsonl")


def _resolve(path: Path) -> list[tuple[str, list[Path]]]:
    """(run name, per-rank files) for one RUN argument."""
    if path.is_dir():
        groups = _group_rank_files(sorted(path.iterdir()))
        if not groups:
            raise InputError(f"{path}: directory holds no per-rank logs (*.rank<k>.jsonl)")
        return sorted(groups.items())
    match = _RANK_FILE.match(path.name)
    if match and path.is_file():
        base = path.with_name(match["base"] + (match["ext"] or ""))
        return [(str(base), _group_rank_files(sorted(path.parent.iterdir()))[str(base)])]
    siblings = _group_rank_files(sorted(path.parent.iterdir())) if path.parent.is_dir() else {}
    if str(path) in siblings:
        return [(str(path), siblings[str(path)])]
    if path.is_file():
        return [(str(path), [path])]  # one file holding every rank's records
    raise InputError(
        f"{path}: no such log; expected it or per-rank files like "
        f"{path.with_name(_rank_name(path.name, 0))}"
    )


def _rank_name(name: str, rank: int) -> str:
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.rank{rank}.{ext}" if dot else f"{name}.rank{rank}"


def _group_rank_files(paths: list[Path]) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = defaultdict(list)
    for candidate in paths:
        match = _RANK_FILE.match(candidate.name)
        if match and candidate.is_file():
            base = candidate.with_name(match["base"] + (match["ext"] or ""))
            groups[str(base)].append(candidate)
    return dict(groups)


def load_run(name: str, files: list[Path], source: str | None = None) -> RunData:
    """Parse every file of one run and check they describe the same job."""
    segments: dict[int, tuple[dict[str, Any], list[Sample]]] = {}
    for path in files:
        segments.update(_read_file(path))
    headers = {rank: header for rank, (header, _) in segments.items()}
    first = headers[min(headers)]
    world_sizes = {_integer(files[0], 1, h, "world_size") for h in headers.values()}
    if len(world_sizes) != 1:
        raise InputError(f"{name}: rank files disagree on world_size: {sorted(world_sizes)}")
    ranks = {rank: tuple(samples) for rank, (_, samples) in sorted(segments.items()) if samples}
    if not ranks:
        raise InputError(
            f"{files[0]}: no step records yet (the run logged no step; check --log-every)"
        )
    device = str(first.get("device") or "unknown")
    per_rank = _by_rank(files)
    run = read_run(name, per_rank) if per_rank else None
    # straggler time only where the judge names a straggler: `fsdpmon goodput`'s split
    figures = goodput(run, run_stragglers(run)) if run is not None else None
    return RunData(
        name=name,
        source=source or name,
        world_size=world_sizes.pop(),
        nodes=_positive_int(first.get("nodes"), default=1),
        model=str(first.get("model") or "unknown"),
        device=device,
        flops_per_token=_optional_float(first.get("flops_per_token")),
        peak_flops=_optional_float(first.get("peak_flops")),
        memory_source="rss" if device == "cpu" else "device",
        ranks=ranks,
        goodput_ratio=figures.goodput_ratio if figures else None,
        badput_seconds=dict(figures.badput_seconds) if figures and figures.wall_seconds > 0
        else None,
    )


def _by_rank(files: list[Path]) -> dict[int, list[Path]]:
    """rank -> its files, for the goodput reader; {} for one file of every rank's records
    (its incarnations cannot be told apart: no goodput)."""
    out: dict[int, list[Path]] = {}
    for path in files:
        match = _RANK_FILE.match(path.name)
        if match is None:
            return {}
        out.setdefault(int(match["rank"]), []).append(path)
    return out


def _read_file(path: Path) -> dict[int, tuple[dict[str, Any], list[Sample]]]:
    """rank -> (header, samples) for every rank whose records this file holds.

    A restarted run appends a fresh ``run`` header to the same file; a header opens a new
    segment for its rank and the report keeps the last one, since counters restart with the
    process. Step records join the segment of their ``rank`` (or the latest header's).
    """
    segments: dict[int, tuple[dict[str, Any], list[Sample]]] = {}
    current: int | None = None
    for number, record in _records(path):
        kind = record.get("kind")
        if kind == "run":
            current = _integer(path, number, record, "rank")
            _integer(path, number, record, "world_size")
            segments[current] = (record, [])
        elif kind == "step":
            if current is None:
                raise InputError(f"{path}:{number}: step record before the run header")
            rank = record.get("rank", current)
            if rank not in segments:
                raise InputError(f"{path}:{number}: step record for rank {rank!r} has no header")
            segments[rank][1].append(_sample(path, number, record))
        # other kinds (later additions to the format) are skipped on purpose
    if not segments:
        raise InputError(f"{path}: no run header (the first record must have kind \"run\")")
    return segments


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each JSON line, streamed: long runs write large logs.

    A line that starts as a record but does not parse is what a crash mid-write leaves (at the
    end, or, once a resumed run appended to it, in the middle with the next record glued on):
    it is skipped with a warning naming the file and line, and a record glued after it is kept.
    Any other bad line is an error.
    """
    seen_any = False
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                seen_any = True
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = _torn(path, number, line)
                    if record is None:
                        continue
                if not isinstance(record, dict):
                    raise InputError(f"{path}:{number}: not a JSON object")
                yield number, record
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if not seen_any:
        raise InputError(f"{path}: empty log")


def _torn(path: Path, number: int, line: str) -> dict[str, Any] | None:
    """The record glued after a torn one on the same line, if any; InputError if not torn."""
    if not line.lstrip().startswith("{"):
        raise InputError(f"{path}:{number}: not a JSON record")
    glued = line.rfind('{"kind"', 1)
    record = None
    if glued > 0:
        try:
            record = json.loads(line[glued:])
        except json.JSONDecodeError:
            record = None
    kept = "; the record glued after it is kept" if isinstance(record, dict) else ""
    log.warning("fsdpmon report: %s:%d: skipped a record cut short by a crash%s", path,
                number, kept)
    return record if isinstance(record, dict) else None


def _sample(path: Path, number: int, record: dict[str, Any]) -> Sample:
    values = {field: _number(path, number, record, field) for field in _STEP_NUMBERS}
    return Sample(
        time=values["time"],
        step=int(values["step"]),
        tokens_total=values["tokens_total"],
        tokens_per_second=values["tokens_per_second"],
        step_time_s=values["step_time_s"],
        mfu=_optional_float(record.get("mfu")),
        peak_memory_bytes=_optional_float(record.get("peak_memory_bytes")),
        loss=_optional_float(record.get("loss")),
        data_wait_ratio=_optional_float(record.get("data_wait_ratio")),
    )


def _number(path: Path, number: int, record: dict[str, Any], field: str) -> float:
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{path}:{number}: field {field!r} must be a finite number, got {value!r}")
    return float(value)


def _integer(path: Path, number: int, record: dict[str, Any], field: str) -> int:
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{path}:{number}: field {field!r} must be an integer >= 0, got {value!r}")
    return value


def _positive_int(value: object, default: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else default  # type: ignore[return-value]


def _optional_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
