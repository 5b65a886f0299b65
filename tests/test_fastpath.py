"""The one seam of the scrape layer's C halves (fsdpmon.scrape.fastpath): the switch chooses
Python for every part or for the parts named, and a real exposition is taken by the C template
path (no C half may quietly decline what layout.py makes, so that the fast path could not be
turned off by a renamed field without a test failing)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import halves
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from synthetic_job import job_expositions

from exporters.exposition import CachedExposition
from exporters.host import HostReader
from exporters.procs import ProcessScanner
from exporters.sampler import Sampler
from exporters.simulated import SimulatedReader
from fsdpmon.errors import ConfigError
from fsdpmon.families import restrict
from fsdpmon.monitor.collector import build_families
from fsdpmon.monitor.state import Heartbeat, RankState
from fsdpmon.scrape import fastpath
from fsdpmon.scrape.filing import Acc, ScrapeResult, Target, file_result
from fsdpmon.scrape.fused import Reading, new_filing_parser
from fsdpmon.scrape.sources.cadence import SLOW_NAMES, STATIC_NAMES
from fsdpmon.scrape.wanted import WANTED

ROOT = Path(__file__).resolve().parents[1]
PROC = Path(__file__).parent / "fixtures" / "proc"
NOW = 1_800_000_000.0


def test_the_switch_makes_every_part_or_the_parts_named_python():
    built = halves.BUILT
    assert fastpath.chosen("1") == fastpath.PYTHON and not fastpath.PYTHON.any()
    assert fastpath.chosen(None) == built and fastpath.chosen(" ") == built
    some = fastpath.chosen("fill_rows, filing")
    assert (some.fill_rows, some.file_samples, some.row_of) == (None, None, None), some
    assert (some.fill, some.make_row) == (built.fill, built.make_row), some
    with pytest.raises(ConfigError, match=r"FSDPMON_PURE_PYTHON.*unknown part\(s\) lines"):
        fastpath.chosen("lines")


def test_each_leg_of_the_suite_runs_the_halves_its_switch_names():
    """scripts/test.sh runs the parse, filing and top tests a second time with
    FSDPMON_PURE_PYTHON=1: there no C half serves; in the first leg all those built do."""
    expected = fastpath.chosen(os.environ.get(fastpath.SWITCH))
    assert fastpath.active() == expected, (fastpath.active(), expected)
    if os.environ.get(fastpath.SWITCH) == "1":
        assert not fastpath.active().any(), fastpath.active()


def test_a_process_started_with_the_switch_serves_python_everywhere():
    """What a user's `FSDPMON_PURE_PYTHON=1 fsdpmon top` gets: no C half, in rows made at import
    too (frozen.maker's row makers are made when rows.py is imported)."""
    code = ("from fsdpmon.scrape import fastpath, rows\n"
            "print(fastpath.active().any(), type(rows.new_rank_row).__name__)")
    env = {**os.environ, fastpath.SWITCH: "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.stdout.split() == ["False", "function"], out.stdout + out.stderr


def _rank_state(rank: int, step: int, loss: float) -> RankState:
    """One rank's state as the monitor's state directory holds it (monitor.state)."""
    snapshot = {
        "pid": 100 + rank, "rank": rank, "local_rank": rank, "job_name": "j",
        "started_unix": NOW - 100,
        "info": {"model": "tiny", "world_size": 2, "nodes": 1, "dtype": "float32",
                 "torch_version": "2.x", "node": "n0", "device": "cpu"},
        "values": {"fsdpmon_train_loss": loss, "fsdpmon_train_step": step,
                   "fsdpmon_train_tokens_per_second": 1000.0 + step},
        "phase_totals": {"data": 0.5 * step}, "phase_means": {"data": 0.01},
    }
    return RankState(rank, snapshot, Heartbeat(1, NOW - 1, step, step, 700, 0.0, 10.0))


def _monitor_body(step: int) -> bytes:
    """The monitor's collector's exposition of two ranks (10 and 11) at ``step``."""
    registry = CollectorRegistry(auto_describe=False)

    class States:
        def collect(self):
            return build_families([_rank_state(r, step + r, 2.0 - step / 100)
                                   for r in (10, 11)], NOW + step)

    registry.register(States())
    return generate_latest(registry)


class Exporter:
    """The exporter's sampler and cached exposition over a simulated node (4 GPUs, the
    fixture's /proc): its bodies as a scrape gets them."""

    def __init__(self) -> None:
        gpus = SimulatedReader(4)
        gpus.open()
        self.sampler = Sampler("node-a", 1.0, gpus, HostReader(str(PROC)),
                               ProcessScanner(str(PROC)))
        self.exposition = CachedExposition(self.sampler, "0.1.0", simulated=True)

    def body(self) -> bytes:
        self.sampler.sample_once()
        return self.exposition.render(None, None)[1]


@halves.needs_c("fill", "fill_rows")
def test_real_expositions_are_taken_by_the_c_template_path():
    """The monitor's and the exporter's expositions and a synthetic job's, refreshed as top
    asks for them (name[]: the fast families each refresh): from the second refresh on, every
    body is checked against its last one and filed by the C halves, and the rows are those
    reading each body line by line in Python files."""
    exporter = Exporter()
    job = sorted(job_expositions("llama2-7b", 2, 2).items())
    asked = WANTED - SLOW_NAMES

    def bodies(refresh: int) -> list[tuple[Target, bytes]]:
        job_bodies = [(Target(f"http://pods{path}"), body.replace(b" 1.", f" {refresh}.".encode()))
                      for path, body in job]
        time.sleep(0.002)  # the simulated GPUs' figures move with the clock
        return [(Target("http://trainer/metrics", pod="p0"), _monitor_body(10 + refresh)),
                (Target("http://node-a/metrics", node="node-a"), exporter.body()),
                *job_bodies]

    filled: list[object] = []  # what the C fill_rows returned, call by call

    def fill_rows(*args: object) -> object:
        filled.append(halves.BUILT.fill_rows(*args))
        return filled[-1]

    c_halves = dataclasses.replace(halves.BUILT, fill_rows=fill_rows)
    c_parser, python_parser = new_filing_parser(STATIC_NAMES), new_filing_parser(STATIC_NAMES)
    for parser in (c_parser, python_parser):
        parser.asking(asked)
    for refresh in range(3):
        served = [(t, restrict(body, set(asked))) for t, body in bodies(refresh)]
        rows = {}
        filled.clear()
        for name, parser, chosen in (("c", c_parser, c_halves),
                                     ("python", python_parser, fastpath.PYTHON)):
            with fastpath.using(chosen):
                acc = Acc()
                for target, body in served:
                    samples, filed = parser.parse_into(body, acc, target)
                    file_result(acc, ScrapeResult(target, samples, filed=filed))
                rows[name] = (acc.ranks, acc.gpus, acc.job)
        assert rows["c"] == rows["python"], f"refresh {refresh}: the halves filed apart"
        assert len(rows["c"][0]) == 2 + 4 and len(rows["c"][1]) == 4 + 4, rows["c"][:2]
        taken = c_parser.readings[Reading.TEMPLATE]
        assert taken == len(served) * refresh, \
            f"refresh {refresh}: {taken} of {len(served) * refresh} bodies taken by the " \
            f"C template path; readings {dict(c_parser.readings)}"
        filed_in_c = sum(isinstance(samples, list) for samples in filled)
        assert filed_in_c == (len(served) if refresh else 0), \
            f"refresh {refresh}: C fill_rows filed {filed_in_c} of {len(served)} bodies"
    assert python_parser.readings[Reading.TEMPLATE] == 0, python_parser.readings
