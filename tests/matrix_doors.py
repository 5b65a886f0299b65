"""The recorded fault matrix (tests/data/matrix/, written by benchmarks/record_matrix.py) and the
doors of issue 48 run over it, each answering the set of (cause, rank) it named.

A recording is the exporter's start to the fault named and a tail: at each moment (about 1 s
apart) the pod endpoint's and the exporter's exposition text as served and the pod's /stacks
document; and the run's JSONL files at the end. The doors that read live pods are fed those
texts over HTTP at the recorded moments (a clock of the recording's times in place of the wall
clock); the Prometheus doors read them backfilled into a real Prometheus
(tests/matrix_prometheus.py); the file doors read the JSONL as written.
"""

from __future__ import annotations

import ast
import contextlib
import json
import lzma
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from payload_server import PayloadServer

from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.incidents.incidents import incidents
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import load_run
from fsdpmon.scrape.sources import targets as targets_module
from fsdpmon.scrape.sources.targets import TargetsSource

MATRIX = Path(__file__).resolve().parent / "data" / "matrix"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
Named = set[tuple[str, "int | None"]]


@dataclass(frozen=True)
class Recording:
    name: str  # the fault (bench_diagnose's / bench_blind's name), or "healthy"
    slug: str  # its file name, and its job and node names once in Prometheus
    cause: str | None  # the fault's cause and rank, as the benchmarks expect them named
    rank: int | None
    also: tuple[str, ...]
    frames: list[dict[str, Any]]  # {"t", "metrics": [train, exporter], "stacks"}
    files: dict[str, str]  # the run's JSONL: name -> text

    def write_files(self, into: Path) -> Path:
        into.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (into / name).write_text(text)
        return into


def recordings() -> list[Recording]:
    out = []
    for path in sorted(MATRIX.glob("*.json.xz")):
        doc = json.loads(lzma.decompress(path.read_bytes()))
        out.append(Recording(doc["name"], path.name.removesuffix(".json.xz"), doc["cause"],
                             doc["rank"], tuple(doc.get("also", ())), doc["frames"],
                             doc["files"]))
    return out


def benchmark_faults() -> set[str]:
    """The fault names of bench_diagnose's MATRIX and bench_blind's FAULTS, read from their
    source (importing them would import torch)."""
    names: set[str] = set()
    for file, table in (("bench_diagnose.py", "MATRIX"), ("bench_blind.py", "FAULTS")):
        for node in ast.parse((BENCHMARKS / file).read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) else None)
            if isinstance(target, ast.Name) and target.id == table:
                keys = node.value.keys if isinstance(node.value, ast.Dict) else [
                    e.elts[0] for e in node.value.elts]  # type: ignore[union-attr]
                names |= {k.value for k in keys if isinstance(k, ast.Constant)}
    return names


class _Clock:
    """Stands for the `time` module in the targets source: its time() is the recording's."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


@contextlib.contextmanager
def _served(rec: Recording) -> Iterator[tuple[list[str], Callable[[dict[str, Any]], None]]]:
    """One loopback server per recorded target, and ``show(frame)``: each then answers its
    /metrics (the pod also its /stacks) as recorded at that frame; a scrape that failed then
    fails (404)."""
    servers = [PayloadServer({}) for _ in rec.frames[0]["metrics"]]

    def show(frame: dict[str, Any]) -> None:
        for index, server in enumerate(servers):
            body, stacks = frame["metrics"][index], frame["stacks"] if index == 0 else None
            payloads = {} if body is None else {"/metrics": body.encode()}
            if stacks is not None:
                payloads["/stacks"] = stacks.encode()
            server.payloads = payloads  # one assignment: a request sees one frame or the next

    try:
        yield [f"127.0.0.1:{s.port}" for s in servers], show
    finally:
        for server in servers:
            server.close()


def live(rec: Recording) -> Named:
    """`fsdpmon diagnose` on the pods (TargetsSource and Diagnoser, /stacks included), refreshed
    at every recorded moment."""
    clock, said = _Clock(), set()
    real_time = targets_module.time
    with _served(rec) as (urls, show):
        source = TargetsSource(urls, timeout_s=2.0)
        diagnoser = Diagnoser(source, 2.0)
        targets_module.time = clock  # type: ignore[assignment]
        try:
            for frame in rec.frames:
                show(frame)
                clock.now = frame["t"]
                said |= {(f.cause, f.rank) for f in diagnoser.update(source.fetch()).findings}
        finally:
            targets_module.time = real_time
            source.close()
    return said


def incidents_from_files(rec: Recording, workdir: Path) -> Named:
    """`fsdpmon incidents RUN_DIR`, as its command computes them."""
    run = load_run(str(rec.write_files(workdir / rec.slug)))
    return {(i.cause, i.rank) for i in incidents(run, goodput(run, run_stragglers(run)))}


def goodput_attribution(rec: Recording, workdir: Path) -> dict[str, dict[int, float]]:
    """`fsdpmon goodput RUN_DIR`'s attribution: badput cause -> rank -> seconds."""
    run = load_run(str(rec.write_files(workdir / rec.slug)))
    return goodput(run, run_stragglers(run)).by_rank


CODE = re.compile(r"`([^`]+)`")


def blind_spots(architecture: str, causes: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """The doors table of docs/architecture.md ("What each door cannot see"): door (the first
    code span of a row's first cell; a row without one is about every door) -> the causes it
    cannot see (the cause names in code spans of the second cell; a cell that begins "every
    cause but" lists those it sees instead)."""
    section = architecture.split("What each door cannot see", 1)[1]
    out: dict[str, frozenset[str]] = {}
    rows = [line for line in section.split("\n\n", 2)[1].splitlines() if line.startswith("|")]
    for line in rows[2:]:  # the header and its rule
        cells = [c.strip() for c in line.strip("|").split("|")]
        door = CODE.search(cells[0])
        if door is None:
            continue
        named = {c for c in CODE.findall(cells[1]) if c in causes}
        out[door.group(1)] = frozenset(
            set(causes) - named if cells[1].startswith("every cause but") else named)
    return out
