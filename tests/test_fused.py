"""Filing while reading (fused.FilingParser) files exactly what parsing and then filing does."""

from __future__ import annotations

import math

import pytest
from synthetic_job import GpuSpec, RankSpec, exporter_exposition, training_exposition

from fsdpmon import catalog
from fsdpmon.scrape.expfmt import Parser
from fsdpmon.scrape.filing import STORED, Acc, ScrapeResult, Target, file_result
from fsdpmon.scrape.fused import FilingParser
from fsdpmon.scrape.sources.cadence import SLOW_NAMES
from fsdpmon.scrape.wanted import REQUIRE, WANTED

STEP = catalog.TRAIN_STEP.name
UTIL = catalog.GPU_UTILIZATION_RATIO.name


def _job(step: int) -> list[tuple[Target, bytes]]:
    """Two training pods and two exporters, a rank of each pod straggling or stalled, a GPU
    throttled with an XID; plus hostile lines the references reject or read oddly."""
    ranks = [RankSpec(rank=r, local_rank=r % 2, node=f"n{r // 2}", world_size=4, nodes=2,
                      step=step + r, stalled=r == 3, straggler_score=0.5 if r == 1 else 1.0)
             for r in range(4)]
    gpus = [GpuSpec(gpu=i, pod="p", pid=100 + i, rank=i, clock_events=("hw_slowdown",) * i,
                    xids=((79, 1),) * i, utilization_ratio=0.5 + step / 1000) for i in range(2)]
    odd = (f'{STEP}{{rank="9",job_name="j"}} NaN\n'  # a rank of its own
           f'{STEP}{{job_name="j"}} 7\n'  # no rank: counted, not filed
           f'{STEP}{{rank="2",job_name="j"}} -NaN\n'  # Go rejects a signed NaN
           f'{STEP}{{rank="2",job_name="j"}} 1_0\n'  # and underscores
           f'  {STEP} {{rank="5",job_name="j"}} 3\n'  # odd spacing: the strict reader's
           f'{UTIL}{{gpu="0",node="n9"}} +Inf\n'
           f'{UTIL}{{gpu="0",node="n9"}} 0.25\n').encode()  # the same series twice: last wins
    return [(Target("http://a/train", pod="p0", node="n0"), training_exposition("j", ranks[:2])),
            (Target("http://b/train", pod="p1"), training_exposition("j", ranks[2:]) + odd),
            (Target("http://a/node", node="n0"), exporter_exposition("n0", gpus)),
            (Target("http://b/node"), exporter_exposition("n1", gpus[:1]))]


def _file(payloads, parse) -> tuple[object, list]:
    """The accumulators (NaN made comparable) and statuses of one refresh."""
    acc, statuses = Acc(), []
    for target, body in payloads:
        statuses.append(file_result(acc, parse(acc, target, body)))
    memos = ("rank_memo", "gpu_memo", "memo_labels")  # keyed by ids: the two ways' differ
    return _nan_as_text({k: v for k, v in vars(acc).items() if k not in memos}), statuses


def _nan_as_text(value: object) -> object:
    if isinstance(value, dict):
        return {k: _nan_as_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_nan_as_text(v) for v in value)
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


@pytest.mark.parametrize("samples_of", [frozenset(), SLOW_NAMES], ids=["all", "cadence"])
def test_filing_while_reading_files_what_parsing_then_filing_does(samples_of):
    plain, fused = Parser(WANTED, REQUIRE), FilingParser(WANTED, REQUIRE, samples_of)
    returned: list[tuple[str, str | None]] = []

    def read(acc, target, body):
        samples, filed = fused.parse_into(body, acc, target)
        returned.extend((s.name, s.labels.get("rank")) for s in samples)
        return ScrapeResult(target, samples, filed=filed)

    for step in (10, 11, 11):  # each refresh files into a new Acc, the cells' rows with it
        payloads = _job(step)
        expected = _file(payloads, lambda acc, t, b: ScrapeResult(t, plain.parse(b)))
        got = _file(payloads, read)
        assert got[1] == expected[1], f"statuses differ: {got[1]} != {expected[1]}"
        assert got[0] == expected[0], f"rows differ: {got[0]} != {expected[0]}"
    ranks = expected[0]["ranks"]  # the odd lines were read as the references read them
    assert (ranks[2]["step"], ranks[9]["step"], ranks[5]["step"]) == (11 + 2, "NaN", 3), ranks
    assert expected[0]["gpus"]["n9", "0"]["utilization_ratio"] == 0.25, expected[0]["gpus"]
    # The stored figures were filed as read, not returned: but those a cadence keeps, and the
    # line only the strict reader takes (rank 5's).
    stored = {(name, rank) for name, rank in returned
              if name in STORED and name not in samples_of} - {(STEP, "5")}
    assert not stored, f"returned as samples: {sorted(stored)}"
    names = {name for name, _ in returned}
    assert {catalog.TRAIN_INFO.name, catalog.GPU_CLOCK_EVENT_REASONS.name} <= names, names


def test_caches_emptied_mid_refresh_lose_nothing(monkeypatch):
    """A parser past its cache limits empties them between two targets of one refresh (its
    label dicts go, and a new dict may get a freed one's id): rows are found as before."""
    plain, fused = Parser(WANTED, REQUIRE), FilingParser(WANTED, REQUIRE, SLOW_NAMES)
    monkeypatch.setattr(FilingParser, "_SERIES_LIMIT", 20)
    cleared = []
    bound = Parser._bound

    def counted(self):
        cleared.append(len(self._series) > self._SERIES_LIMIT)
        bound(self)

    monkeypatch.setattr(Parser, "_bound", counted)

    def read(acc, target, body):
        samples, filed = fused.parse_into(body, acc, target)
        return ScrapeResult(target, samples, filed=filed)

    for step in (10, 11):
        payloads = _job(step)
        expected = _file(payloads, lambda acc, t, b: ScrapeResult(t, plain.parse(b)))
        got = _file(payloads, read)
        assert got == expected, f"differ after emptied caches: {got} != {expected}"
    assert sum(cleared) >= 4, f"the caches were emptied {sum(cleared)} times, not each target"
