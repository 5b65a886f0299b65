"""A body that is its target's last one but for its values is filed from its values alone
(layout.py, with the C half of fill: _lines.c), exactly as reading it line by line files it;
what a layout cannot take exactly is read line by line. The tests that compare rows run with
the C halves and without them (every body read line by line)."""

from __future__ import annotations

from collections.abc import Iterator

import halves
import pytest
from halves import half  # noqa: F401 - the fixture
from synthetic_job import GpuSpec, RankSpec, exporter_exposition, training_exposition
from test_fused import _file

from fsdpmon import catalog
from fsdpmon.scrape import fastpath, layout
from fsdpmon.scrape.expfmt import Parser, Sample
from fsdpmon.scrape.filing import RANK_KIND, Acc, Filed, ScrapeResult, Target
from fsdpmon.scrape.fused import FilingParser, Reading
from fsdpmon.scrape.layout import Cell, Group, Layout
from fsdpmon.scrape.sources.cadence import SLOW_NAMES
from fsdpmon.scrape.wanted import REQUIRE, WANTED

STEP = catalog.TRAIN_STEP.name
LOSS = catalog.TRAIN_LOSS.name


def _payloads(step: int, tail: str = "") -> list[tuple[Target, bytes]]:
    """Two training pods (``tail`` ending the second) and two exporters; the values move with
    ``step``, the series stay."""
    ranks = [RankSpec(rank=r, local_rank=r % 2, node=f"n{r // 2}", world_size=4, nodes=2,
                      step=step + r, loss=2.0 + step / 100, straggler_score=0.5 + r / 10)
             for r in range(4)]
    gpus = [GpuSpec(gpu=i, pod="p", pid=100 + i, rank=i, clock_events=("hw_slowdown",) * i,
                    utilization_ratio=0.5 + step / 1000 + i / 10) for i in range(2)]
    return [(Target("http://a/train", pod="p0"), training_exposition("j", ranks[:2], ranks)),
            (Target("http://b/train", pod="p1"),
             training_exposition("j", ranks[2:]) + tail.encode()),
            (Target("http://a/node", node="n0"), exporter_exposition("n0", gpus)),
            (Target("http://b/node"), exporter_exposition("n1", gpus[:1]))]


@pytest.fixture
def c_half(half: str) -> bool:  # noqa: F811 - the fixture imported above
    """Whether the C halves serve (the test runs with them and with their Python twins)."""
    return half == "c"


@pytest.fixture
def c_only() -> Iterator[None]:
    """The C halves serve: without the C half of fill, every body is read line by line."""
    if halves.BUILT.fill is None:
        pytest.skip("fsdpmon.scrape._lines is not built")
    with fastpath.using(halves.BUILT):
        yield


class Reader:
    """One FilingParser over refreshes, counting the bodies it read line by line (the others
    were taken by their templates)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, samples_of=frozenset()) -> None:
        self.fused, self.plain = FilingParser(WANTED, REQUIRE, samples_of), Parser(WANTED, REQUIRE)
        self.by_line: list[str] = []
        read = FilingParser._read

        def counted(parser, matches, data, acc, target):
            self.by_line.append(target.url)
            return read(parser, matches, data, acc, target)

        monkeypatch.setattr(FilingParser, "_read", counted)

    def refresh(self, payloads: list[tuple[Target, bytes]]) -> list[str]:
        """Checks one refresh against parsing then filing; returns the targets read by line."""
        self.by_line.clear()
        templated = self.fused.readings[Reading.TEMPLATE]

        def read(acc, target, body):
            samples, filed = self.fused.parse_into(body, acc, target)
            return ScrapeResult(target, samples, filed=filed)

        expected = _file(payloads, lambda acc, t, b: ScrapeResult(t, self.plain.parse(b)))
        got = _file(payloads, read)
        assert got[1] == expected[1], f"statuses differ: {got[1]} != {expected[1]}"
        assert got[0] == expected[0], f"rows differ: {got[0]} != {expected[0]}"
        taken = self.fused.readings[Reading.TEMPLATE] - templated
        assert taken + len(self.by_line) == len(payloads), (taken, self.by_line)
        return list(self.by_line)


ALL = ["http://a/train", "http://b/train", "http://a/node", "http://b/node"]


@pytest.mark.parametrize("samples_of", [frozenset(), SLOW_NAMES], ids=["all", "cadence"])
def test_a_body_like_the_last_is_filed_from_its_values(monkeypatch, samples_of, c_half):
    """With the C halves, each body is checked against its target's last one and filed from
    its values; without them every body is read line by line. The rows are the same."""
    reader = Reader(monkeypatch, samples_of)
    first = reader.refresh(_payloads(10))
    assert first == ALL, f"the first bodies are read line by line: {first}"
    for step in (11, 12, 13):  # new values, the same series
        by_line = reader.refresh(_payloads(step))
        assert by_line == ([] if c_half else ALL), f"step {step}: read line by line: {by_line}"


@pytest.mark.parametrize("value", ["NaN", "-NaN", "+Inf", "1_0", "0x10", "abc", "١", "１"])
def test_values_a_template_cannot_take_are_read_line_by_line(monkeypatch, c_only, value):
    """NaN (Go refuses it signed), values Python's float reads and Go's does not (other
    scripts' digits among them), and no number at all: the body is read line by line (which
    drops the line, as parsing does), then the template serves again."""
    reader = Reader(monkeypatch)
    line = f'{LOSS}{{job_name="j",rank="9"}} '
    reader.refresh(_payloads(10, line + "1.5\n"))
    assert reader.refresh(_payloads(11, line + "2.5\n")) == []
    by_line = reader.refresh(_payloads(12, line + value + "\n"))
    if value == "+Inf":  # a number like any other
        assert by_line == [], by_line
    else:
        assert by_line == ["http://b/train"], by_line
    reader.refresh(_payloads(13, line + "3.5\n"))
    assert reader.refresh(_payloads(14, line + "4.5\n")) == []


def test_one_field_of_one_row_from_two_label_sets_keeps_line_order(monkeypatch, c_half):
    """Rank 9's step under two label orders (two label dicts, one row): the line written last
    wins, as line by line, so no layout is made for that body."""
    reader = Reader(monkeypatch)
    for step in (10, 11, 12):
        tail = (f'{STEP}{{rank="9",job_name="j"}} {step}\n'
                f'{LOSS}{{rank="9",job_name="j"}} 1.0\n'
                f'{STEP}{{job_name="j",rank="9"}} {step * 2}\n')
        by_line = reader.refresh(_payloads(step, tail))
        assert by_line == (["http://b/train"] if step > 10 and c_half else ALL), by_line


def test_new_or_gone_series_are_read_line_by_line_and_laid_out_anew(monkeypatch, c_only):
    reader = Reader(monkeypatch)
    reader.refresh(_payloads(10))
    rank = f'{STEP}{{job_name="j",rank="7"}} '
    assert reader.refresh(_payloads(11, rank + "1\n")) == ["http://b/train"]  # a new rank
    assert reader.refresh(_payloads(12, rank + "2\n")) == []
    assert reader.refresh(_payloads(13)) == ["http://b/train"]  # gone again
    assert reader.refresh(_payloads(14)) == []
    assert reader.refresh(_payloads(15, rank.replace("7", "8") + "3\n")) == ["http://b/train"]


def test_layouts_of_targets_that_come_and_go_are_bounded(monkeypatch, c_only):
    """Pods that come and go (a new URL each) leave layouts behind: once they hold more
    lines than the parser's series limit, they go, and reading stays exact."""
    reader = Reader(monkeypatch)
    monkeypatch.setattr(FilingParser, "_SERIES_LIMIT", 400)
    for generation in range(12):
        payloads = [(Target(f"{t.url}/{generation}", t.pod, t.node), body)
                    for t, body in _payloads(10 + generation)]
        reader.refresh(payloads)
        held = [len(v.order) for v in reader.fused._layouts.values()]
        assert held, "no layout was made"
        # at most the limit, and then this refresh's bodies, laid out since the last clearing
        assert sum(held) <= 400 + sum(held[-4:]), f"generation {generation}: {held} lines"


def test_a_body_whose_other_bytes_changed_is_read_and_laid_out_anew(monkeypatch, c_only):
    """A comment changed, the series did not: that body is read line by line and becomes the
    template the next body is checked against."""
    reader = Reader(monkeypatch)
    reader.refresh(_payloads(10, "# HELP x one y\n"))
    assert reader.refresh(_payloads(11, "# HELP x two y\n")) == ["http://b/train"]
    assert reader.refresh(_payloads(12, "# HELP x two y\n")) == []


def _hand_made() -> tuple[Layout, list[Cell]]:
    """A layout no parser of top's WANTED names makes (none is a _bucket or _count): two cells,
    one of a rank without a rank (no row), then a histogram's count and a plain sample."""
    rank = Cell(RANK_KIND, {"rank": "3"}, gpu=False)
    lost = Cell(RANK_KIND, {"job_name": "j"}, gpu=False)
    made = Layout(groups=(Group(rank, ("loss", "step"), 0, 2), Group(lost, ("loss",), 2, 3)),
                  names=(f"{LOSS}_count", STEP), labels=({"a": "1"}, {"b": "2"}),
                  first_sample=3, counted=(3,), filed=Filed(3, True, False), order=(),
                  body=b"", slots=b"")
    return made, [rank, lost]


@pytest.mark.parametrize("values, filed", [
    ([1.0, 2.0, 3.0, 4.0, 5.0], True), ([1.0, 2.0, 3.0, -4.0, 5.0], False),
    ([1.0, float("nan"), 3.0, 4.0, 5.0], False), ([1.0, 2.0, 3.0, 4.0, -5.0], True)])
def test_values_filed_from_a_hand_made_layout(values, filed, c_half):
    """A negative count or any NaN files nothing (the body is then read line by line); else
    each cell's row takes its fields and the rest come back as samples, with the C half and
    without."""
    made, cells = _hand_made()
    acc = Acc()
    done = layout.file_values(made, values, acc, Target("http://a/train", pod="p"))
    if not filed:
        assert done is None and acc.ranks == {} and cells[0].acc is None, (done, acc.ranks)
        return
    samples, what = done
    assert what is made.filed and samples == [(f"{LOSS}_count", {"a": "1"}, values[3]),
                                              (STEP, {"b": "2"}, values[4])], samples
    assert all(type(s) is Sample for s in samples), [type(s) for s in samples]
    assert acc.ranks[3] == {"pod": "p", "node": "", "target": "http://a/train",
                            "local_rank": None, "loss": 1.0, "step": 2.0}, acc.ranks
    assert (cells[0].acc, cells[0].row) == (acc, acc.ranks[3]), vars(cells[0])
    assert (cells[1].acc, cells[1].row) == (acc, None), (cells[1].acc, cells[1].row)
