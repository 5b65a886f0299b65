"""Reading and filing fused: the hot path of a refresh of plain-HTTP targets.

Most of a large job's samples are one figure of a rank, a GPU or the job, stored under its
field in that row (filing.STORED). Parsed into a Sample and then filed, each costs a tuple and
a list entry, then a name lookup and a row lookup by its label dict. Here a series seen before
maps to its field and to a cell shared by every series with the same labels (one rank's, one
GPU's), which holds the row of the refresh in progress: such a sample costs one lookup, a
float and a store (benchmarks/bench_top.py prints both ways' time on a job's payloads). The
other samples (info series, events, hosts, processes, the families a cadence carries, lines
the strict reader takes) come back as Samples, filed by filing.file_result as before. A body
that is its target's last one but for its values is filed from its values alone (layout.py,
where the C half of fill serves).

Read on the refreshing thread only: cells are shared by every target of a refresh.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable

from fsdpmon.scrape import fastpath
from fsdpmon.scrape.expfmt import (
    COUNT_SUFFIXES,
    MISSING,
    Histograms,
    Parser,
    Sample,
    Series,
    terminated,
)
from fsdpmon.scrape.filing import GPU_KIND, STORED, Acc, Filed, Target, row_finder
from fsdpmon.scrape.layout import Cell, Layout, Match, file_values, layout_of, template_values
from fsdpmon.scrape.wanted import REQUIRE, WANTED

Names = frozenset[str] | None  # the names a refresh asks for (None: all)
Where = tuple[str, Names]  # a body's target URL and the names asked for it


class Reading(enum.Enum):
    """How a body was read (FilingParser.readings counts them)."""

    TEMPLATE = "checked against its target's last body and its values read (_lines.fill)"
    LINES = "line by line"


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
        # (target URL, the names asked) → the layout of its last body, which is its template:
        # keyed by the names too, as a cadence asks for more every few refreshes.
        self._layouts: dict[Where, Layout] = {}
        self._asking: Names = None
        # The scan's pattern, for the layouts' templates (layout.template_slots): only where
        # every required text ends in '"', which no value holds.
        self._template_line = self._line if all(
            text.endswith(b'"') for text in self._require.values()) else None
        self._laid = 0  # the lines the layouts hold: they go once past _SERIES_LIMIT
        self.readings: Counter[Reading] = Counter()  # how the bodies were read, so far

    def _bound(self) -> None:
        if len(self._series) > self._SERIES_LIMIT or len(self._blocks) > self._CACHE_LIMIT:
            self._hot.clear()  # their label dicts go with the caches
            self._cells.clear()
            self._layouts.clear()
        if len(self._layouts) > self._CACHE_LIMIT or self._laid > self._SERIES_LIMIT:
            self._layouts.clear()  # targets that came and went
        if not self._layouts:
            self._laid = 0
        super()._bound()

    def asking(self, names: frozenset[str] | None) -> None:
        """The names this refresh asks every target for (None: all of them)."""
        self._asking = names

    def parse_into(self, payload: str | bytes, acc: Acc,
                   target: Target) -> tuple[list[Sample], Filed]:
        """Files the stored figures of one exposition into ``acc`` (as filing.file_result
        would, ``target`` being where it came from); returns the other samples and a tally."""
        self._bound()
        data = terminated(payload)
        where = target.url, self._asking
        kept = self._layouts.get(where)
        values = template_values(kept, data) if kept is not None else None
        if values is not None:
            done = file_values(kept, values, acc, target)  # type: ignore[arg-type]
            if done is not None:
                self.readings[Reading.TEMPLATE] += 1
                return done
        self.readings[Reading.LINES] += 1
        matches = self._line.findall(data)
        done = self._read(matches, data, acc, target)
        if values is None and self._templates():  # not the template: this body is the next
            layout = layout_of(matches, acc, self._hot, self._series, data,
                               self._template_line)  # type: ignore[arg-type]
            if layout is None:
                self._layouts.pop(where, None)
            else:
                self._layouts[where] = layout
                self._laid += len(layout.order)
        return done

    def _templates(self) -> bool:
        """Whether bodies are checked against templates (the C half of fill serves)."""
        return self._template_line is not None and fastpath.active().fill is not None

    def _read(self, matches: list[Match], data: bytes, acc: Acc,
              target: Target) -> tuple[list[Sample], Filed]:
        """parse_into line by line."""
        out: list[Sample] = []
        known_of, hot_of, row_of = self._series, self._hot, row_finder()
        histograms = Histograms(data)
        count, train, gpu = 0, False, None
        for series, raw, odd in matches:
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
