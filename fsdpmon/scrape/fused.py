"""Reading and filing fused: the hot path of a refresh of plain-HTTP targets.

Most of a large job's samples are one figure of a rank, a GPU or the job, stored under its
field in that row (filing.STORED). Parsed into a Sample and then filed, each costs a tuple and
a list entry, then a name lookup and a row lookup by its label dict. Here a series seen before
maps to its field and to a cell shared by every series with the same labels (one rank's, one
GPU's), which holds the row of the refresh in progress: such a sample costs one lookup, a
float and a store (`benchmarks/bench_top.py --parts` prints both ways' time on a job's
payloads). The other samples (info series, events, hosts, processes, the families a cadence
carries, lines the strict reader takes) come back as Samples, filed by filing.file_result as
before.

Read on the refreshing thread only: cells are shared by every target of a refresh.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsdpmon.scrape.expfmt import (
    COUNT_SUFFIXES,
    MISSING,
    Histograms,
    Parser,
    Sample,
    Series,
    terminated,
)
from fsdpmon.scrape.filing import GPU_KIND, STORED, Acc, Filed, Row, Target, row_of
from fsdpmon.scrape.wanted import REQUIRE, WANTED


class Cell:
    """The row that the series of one label dict fill, of one kind (a rank's, a GPU's, the
    job's): found by ``row_of`` on its first series of a refresh, then kept until the next
    refresh finds its own."""

    __slots__ = ("acc", "gpu", "kind", "labels", "row")

    def __init__(self, kind: int, labels: dict[str, str], gpu: bool) -> None:
        self.acc: Acc | None = None  # the refresh that found ``row``
        self.row: Row | None = None  # None: a rank series without a rank
        self.kind = kind
        self.labels = labels
        self.gpu = gpu  # a GPU's row


class FilingParser(Parser):
    """A Parser that can also file what it reads (``parse_into``); ``parse`` is unchanged.

    ``samples_of`` names STORED names to return as Samples all the same (those a cadence keeps
    between refreshes)."""

    def __init__(self, names: Iterable[str], require: dict[str, str] | None = None,
                 samples_of: Iterable[str] = ()) -> None:
        super().__init__(names, require)
        kept = frozenset(samples_of)
        self._stored = {name: kind_key for name, kind_key in STORED.items()
                        if name in self._name_of.values() and name not in kept
                        and not name.endswith(COUNT_SUFFIXES)}
        self._hot: dict[bytes, tuple[Cell, str]] = {}  # series as written → (cell, field)
        self._cells: dict[tuple[int, int], Cell] = {}  # (kind, id(labels)) → cell

    def _bound(self) -> None:
        if len(self._series) > self._SERIES_LIMIT or len(self._blocks) > self._CACHE_LIMIT:
            self._hot.clear()  # their label dicts go with the caches
            self._cells.clear()
        super()._bound()

    def parse_into(self, payload: str | bytes, acc: Acc,
                   target: Target) -> tuple[list[Sample], Filed]:
        """Files the stored figures of one exposition into ``acc`` (as filing.file_result
        would, ``target`` being where it came from); returns the other samples and a tally."""
        self._bound()
        data = terminated(payload)
        out: list[Sample] = []
        known_of, hot_of = self._series, self._hot
        histograms = Histograms(data)
        count, train, gpu = 0, False, None
        for series, raw, odd in self._line.findall(data):
            hot = hot_of.get(series)
            if hot is None:
                known = known_of.get(series, MISSING)
                if known is MISSING:
                    known = self._first_seen(series, odd, histograms, out)
                    hot = self._new_hot(series, known)
                if hot is None:
                    if known is not None:
                        self._add_sample(out, known, raw, histograms)
                    continue
            cell, field = hot
            try:
                value = float(raw)
            except ValueError:
                continue
            if value != value and raw[:1] in b"+-":  # Go's float takes no signed NaN
                continue
            if cell.acc is not acc:  # Cell.row_in, inlined: this loop runs once per line
                cell.acc, cell.row = acc, row_of(acc, cell.kind, cell.labels, target)
            row = cell.row
            if row is not None:
                row[field] = value
            count += 1
            if cell.gpu:
                gpu = cell
            else:
                train = True
        node = gpu.labels.get("node", "") if gpu is not None else ""
        return out, Filed(count, train, gpu is not None, node)

    def _new_hot(self, series: bytes, known: Series | None) -> tuple[Cell, str] | None:
        """The cell and field of a series seen for the first time; None if it is no STORED
        name's (or is invalid)."""
        if known is None:
            return None
        name, labels = known
        if name not in self._stored:
            return None
        kind, field = self._stored[name]
        cell = self._cells.get((kind, id(labels)))
        if cell is None:
            cell = self._cells[kind, id(labels)] = Cell(kind, labels, kind == GPU_KIND)
        hot = self._hot[series] = (cell, field)
        return hot


def new_filing_parser(samples_of: Iterable[str] = ()) -> FilingParser:
    """The parser of the plain-HTTP sources: only what top reads, filed as it is read."""
    return FilingParser(WANTED, REQUIRE, samples_of)
