"""The C half of filing (fsdpmon/scrape/_filing.c) files what the Python loop files: the same rows,
memos, statuses and errors, on a job's payloads, on hostile ones and on samples no parser
makes (odd label values, rows without a node, values of other types)."""

from __future__ import annotations

import math

import halves
from synthetic_job import GpuSpec, exporter_exposition, job_expositions
from test_fused import _job

from fsdpmon import catalog
from fsdpmon.scrape import fastpath, filing
from fsdpmon.scrape.expfmt import Parser, Sample
from fsdpmon.scrape.filing import (
    GPU_KIND,
    JOB_KIND,
    RANK_KIND,
    Acc,
    ScrapeResult,
    Target,
    file_result,
)
from fsdpmon.scrape.fused import FilingParser
from fsdpmon.scrape.sources.cadence import SLOW_NAMES
from fsdpmon.scrape.wanted import REQUIRE, WANTED

needs_c = halves.needs_c("file_samples", "row_of")

STEP = catalog.TRAIN_STEP.name
INFO = catalog.TRAIN_INFO.name
EXIT = catalog.TRAIN_PREVIOUS_EXIT.name
UTIL = catalog.GPU_UTILIZATION_RATIO.name
CLOCK = catalog.GPU_CLOCK_EVENT_REASONS.name
XID = catalog.GPU_XID_ERRORS_TOTAL.name
ECC = catalog.GPU_ECC_ERRORS_TOTAL.name
PINFO = catalog.PROCESS_INFO.name
PSTATE = catalog.PROCESS_STATE.name
PCPU = catalog.PROCESS_CPU_UTILIZATION_RATIO.name
PMEM = catalog.GPU_PROCESS_MEMORY_USED_BYTES.name
HOST = catalog.HOST_LOAD1.name
JOB = catalog.JOB_WORLD_SIZE.name


def _comparable(value: object) -> object:
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return type(value)(_comparable(v) for v in value)
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _filed(acc: Acc) -> object:
    """The accumulators, memos and all (each memo's ids as the labels they stand for: the
    strict reader's dicts are new each parse)."""
    labels_of = {id(labels): labels for labels in acc.memo_labels}
    out = vars(acc) | {memo: sorted((repr(labels_of[key]), repr(_comparable(row)))
                                    for key, row in getattr(acc, memo).items())
                       for memo in ("rank_memo", "gpu_memo")}
    return _comparable(out)


def _outcome(results: list[ScrapeResult], acc: Acc | None = None) -> tuple[object, object]:
    """The accumulators and the statuses, or the error, of filing ``results`` in turn."""
    acc = acc or Acc()
    try:
        statuses = [file_result(acc, result) for result in results]
    except Exception as exc:
        return (type(exc), str(exc)), _filed(acc)
    return statuses, _filed(acc)


def _both_ways(make: object) -> tuple[object, object]:
    """``make()`` (fresh results each call) filed by the C half, then by Python."""
    with fastpath.using(halves.BUILT):
        got = _outcome(make())  # type: ignore[operator]
    with fastpath.using(fastpath.PYTHON):
        expected = _outcome(make())  # type: ignore[operator]
    return got, expected


def _results(samples: list[Sample], target: Target | None = None) -> list[ScrapeResult]:
    return [ScrapeResult(target or Target("http://t/metrics", pod="p", node="n0"), samples)]


@needs_c
def test_a_large_jobs_payloads_file_alike_both_ways():
    """Every exposition of a 4-node job, parsed as top's cadence parses (the slow tiers as
    samples): the rows of three refreshes, filing into new accumulators each time."""
    parser = FilingParser(WANTED, REQUIRE, SLOW_NAMES)
    bodies = sorted(job_expositions("llama2-7b", 4, 8).items())

    def refresh() -> list[ScrapeResult]:
        acc, results = Acc(), []
        for path, body in bodies:
            target = Target(f"http://pods{path}", pod=path.rsplit("/", 1)[-1])
            samples, filed = parser.parse_into(body, acc, target)
            results.append(ScrapeResult(target, samples, filed=filed))
        return results

    for _ in range(3):
        got, expected = _both_ways(refresh)
        assert got == expected, f"differ: C {got[0]} != Python {expected[0]}"
    statuses, rows = got
    assert len(rows["ranks"]) == 32 and len(rows["procs"]) == 32, \
        f"{len(rows['ranks'])} ranks, {len(rows['procs'])} processes filed of 32 each"
    assert {s.kind for s in statuses} == {"train", "exporter"}, statuses


@needs_c
def test_hostile_payloads_file_alike_both_ways():
    """test_fused's job: stalled and straggling ranks, throttled GPUs with XIDs, lines the
    references reject, a rank without a rank label."""
    plain = Parser(WANTED, REQUIRE)
    for step in (10, 11):
        got, expected = _both_ways(lambda step=step: [
            ScrapeResult(t, plain.parse(b)) for t, b in _job(step)])
        assert got == expected, f"differ: C {got} != Python {expected}"
    assert any(g.get("clock_events") for g in got[1]["gpus"].values()), got[1]["gpus"]
    assert any(g.get("xid_counts") for g in got[1]["gpus"].values()), got[1]["gpus"]


def _odd_samples() -> list[Sample]:
    """Samples no exporter serves but a parser could make, or a caller could pass."""
    rank = {"rank": " 7 ", "local_rank": "x", "job_name": "j"}  # int() takes the spaces
    samples = [
        Sample(STEP, rank, 3.0), Sample(STEP, {"rank": "\u0663"}, 1.0),  # Arabic-Indic 3
        Sample(STEP, {"rank": "1_0"}, 2.0), Sample(STEP, {"rank": ""}, 4.0),
        Sample(STEP, {}, 5.0), Sample(INFO, rank, 1.0),
        Sample(INFO, {"rank": "7", "node": "", "world_size": "+8", "model": "m"}, 1.0),
        Sample(EXIT, {"rank": "7", "how": "oom"}, 1), Sample(EXIT, {"rank": "7"}, 0.0),
        Sample(JOB, {}, 8.0), Sample(UTIL, {"gpu": "0"}, float("nan")),
        Sample(UTIL, {"gpu": "1", "node": "n5", "model": "", "uuid": "u"}, 0.5),
        Sample(CLOCK, {"gpu": "0"}, 0.0), Sample(CLOCK, {"gpu": "0"}, float(2**3)),
        Sample(CLOCK, {"gpu": "2", "node": "n5"}, float("nan")),
        Sample(XID, {"gpu": "0", "xid": "79"}, 2.0), Sample(ECC, {"gpu": "0"}, 1.0),
        Sample(ECC, {"gpu": "0", "type": "uncorrected"}, 3.0),
        Sample(PINFO, {"pid": "12", "command": "c", "user": "u", "rank": "r"}, 1.0),
        Sample(PSTATE, {"pid": "12", "state": "R"}, 1),
        Sample(PSTATE, {"pid": "12", "state": "S"}, 0),
        Sample(PCPU, {"pid": "12", "node": "n5", "pod": "p"}, 0.5),
        Sample(PCPU, {"pid": "?"}, 1.0),
        Sample(PMEM, {"pid": "12", "gpu": "0"}, 5), Sample(PMEM, {"pid": "12", "gpu": "1"}, 6.5),
        Sample(HOST, {"node": "n6"}, 0.3), Sample(PCPU, {"pid": "13"}, 0.25),
        Sample(catalog.HOST_CPU_UTILIZATION_RATIO.name, {"cpu": "all"}, 0.4),
        Sample(catalog.EXPORTER_INFO.name, {"simulated": "True"}, 1.0),
        Sample("not_read_by_top", {"rank": "1"}, 1.0), Sample(UTIL, {"gpu": "0"}, 7),
    ]
    shared = {"gpu": "3", "node": "n7"}  # one dict labels a GPU's figure and its event
    process = {"pid": "21"}  # no node label: a process of the node the target is known by
    bare = {"gpu": "8"}  # its row stays empty: filing's `memo.get(...) or entry` finds it anew
    return [*samples, Sample(CLOCK, shared, 0.0), Sample(UTIL, shared, 0.1),
            Sample(CLOCK, shared, 1.0), Sample(CLOCK, bare, 0.0), Sample(CLOCK, bare, 0.0),
            Sample(PCPU, process, 0.1), Sample(HOST, {"node": "n8"}, 1.0),
            Sample(catalog.PROCESS_RESIDENT_MEMORY_BYTES.name, process, 9.0)]


@needs_c
def test_odd_samples_file_alike_both_ways():
    samples = _odd_samples()
    got, expected = _both_ways(lambda: _results(samples))
    assert got == expected, f"differ: C {got} != Python {expected}"
    ranks, procs = got[1]["ranks"], got[1]["procs"]
    assert sorted(ranks) == [3, 7, 10], f"ranks filed: {sorted(ranks)}"
    twelve = procs["n5", 12]  # the node of the GPU series before it
    assert twelve["gpus"] == {"0", "1"} and twelve["gpu_memory_bytes"] == 11.5, procs
    # One process's labels, before and after a host series moved the target to another node.
    assert (procs["n7", 21], procs["n8", 21]) == ({"cpu_ratio": 0.1}, {"rss_bytes": 9.0}), procs
    # Each sample alone, from a fresh start: no sample is filed alike only by luck of order.
    for sample in samples:
        got, expected = _both_ways(lambda s=sample: _results([s]))
        assert got == expected, f"{sample}: C {got} != Python {expected}"


@needs_c
def test_the_targets_node_and_the_first_results_rows_carry_over_alike():
    """A second target files into the rows the first made; a target without a node takes its
    processes' node from the GPU series before them."""
    first = Target("http://a/m", pod="pa", node="na")
    second = Target("http://b/m", pod="pb")
    samples = _odd_samples()
    got, expected = _both_ways(lambda: [*_results(samples, first),
                                                     *_results(samples[::-1], second)])
    assert got == expected, f"differ: C {got} != Python {expected}"


@needs_c
def test_errors_are_the_same_both_ways():
    """int() of a label that is no text raises TypeError (no parser makes one): raised alike,
    with what was filed before it."""
    bad = [Sample(STEP, {"rank": "1"}, 1.0), Sample(STEP, {"rank": ["1"]}, 2.0)]  # type: ignore[dict-item]
    got, expected = _both_ways(lambda: _results(bad))
    assert got == expected, f"differ: C {got} != Python {expected}"
    assert got[0][0] is TypeError, got
    # A rank row without its node field (not one _rank_entry makes), then its info sample.
    info = [Sample(INFO, {"rank": "4", "node": ""}, 1.0)]
    with fastpath.using(halves.BUILT):
        c_way = _outcome(_results(info), Acc(ranks={4: {}}))
    with fastpath.using(fastpath.PYTHON):
        python_way = _outcome(_results(info), Acc(ranks={4: {}}))
    assert c_way == python_way and c_way[0][0] is KeyError, f"C {c_way} != Python {python_way}"


@needs_c
def test_samples_that_are_not_tuples_are_filed_by_the_python_loop():
    """The C loop takes (str, dict, value) tuples only; anything else is left whole to Python."""
    rows = [(STEP, {"rank": "1"}, 1.0), [UTIL, {"gpu": "0"}, 0.5]]
    got, expected = _both_ways(lambda: _results(rows))  # type: ignore[arg-type]
    assert got == expected and got[1]["ranks"][1]["step"] == 1.0, f"C {got} != Python {expected}"
    assert halves.BUILT.file_samples(Acc(), rows, Target("u"), False, False, "") is None


@needs_c
def test_row_of_finds_the_rows_python_finds():
    """The fused path's row_of, with the C entries and without, on a GPU's and a rank's labels."""
    labels = [{"rank": "2", "job_name": "j", "local_rank": "1"}, {"rank": "x"},
              {"gpu": "1", "node": "n", "pod": "p", "uuid": ""}, {}]

    def find() -> list[ScrapeResult]:
        acc = Acc()
        row_of = filing.row_finder()
        for kind in (RANK_KIND, GPU_KIND, JOB_KIND):
            for one in labels:
                row_of(acc, kind, one, Target("http://x/m", pod="q", node="m"))
        return [ScrapeResult(Target("u"), [])], acc

    with fastpath.using(halves.BUILT):
        got = _outcome(*find())
    with fastpath.using(fastpath.PYTHON):
        expected = _outcome(*find())
    assert got == expected, f"C {got} != Python {expected}"


@needs_c
def test_exporter_with_throttled_gpus_and_processes_files_alike():
    gpus = [GpuSpec(gpu=i, pod="p", pid=100 + i, rank=i, clock_events=("hw_slowdown",) * (i % 2),
                    xids=((79, i),) * (i % 3 == 0)) for i in range(8)]
    body = exporter_exposition("n3", gpus)
    plain = Parser(WANTED, REQUIRE)
    target = Target("http://n3/metrics")
    got, expected = _both_ways(lambda: [ScrapeResult(target, plain.parse(body))])
    assert got == expected, f"differ: C {got} != Python {expected}"
    with_xids = sum(bool(gpu.get("xid_counts")) for gpu in got[1]["gpus"].values())
    assert len(got[1]["procs"]) == 8 and with_xids == 3, got[1]
