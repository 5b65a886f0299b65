"""A target's layout: the series its body holds, in order, and where each line's value goes;
a later body with the same series in the same order is filed from its values alone.

A pod serves the same series every refresh; only the values change. Read line by line, each
line costs a loop turn in Python (a lookup, a float, a store). Checked against the layout, the
whole body costs a few passes in C: the series compared as one list, the values picked and
converted by ``map``, each row's figures stored by one ``dict.update``, the other samples made
by ``map`` (benchmarks/bench_top.py prints both ways' time). The result is what reading line
by line gives, or nothing (then the body is read line by line): a layout is only made when it
can be exact, and only used when every value reads as the line-by-line reading would take it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from fsdpmon.scrape import fastpath
from fsdpmon.scrape.expfmt import COUNT_SUFFIXES, MISSING, Sample, Series
from fsdpmon.scrape.filing import Acc, Filed, Row, Target, row_finder


class Cell:
    """The row that the series of one label dict fill, of one kind (a rank's, a GPU's, the
    job's): found by ``row_of`` on its first series of a refresh, then kept until the next
    refresh finds its own. _lines.fill_rows reads and sets these attributes by name."""

    __slots__ = ("acc", "gpu", "kind", "labels", "row")

    def __init__(self, kind: int, labels: dict[str, str], gpu: bool) -> None:
        self.acc: Acc | None = None  # the refresh that found ``row``
        self.row: Row | None = None  # None: a rank series without a rank
        self.kind = kind
        self.labels = labels
        self.gpu = gpu  # a GPU's row

    def row_in(self, acc: Acc, target: Target, row_of: Callable[..., Row | None]) -> Row | None:
        """The cell's row in the refresh filing into ``acc``."""
        if self.acc is not acc:  # the first of its series this refresh
            self.acc, self.row = acc, row_of(acc, self.kind, self.labels, target)
        return self.row


class Group(NamedTuple):
    """One cell's lines of a layout: the fields they fill, and where their values lie among
    the values a layout picks (``start`` to ``stop``)."""

    cell: Cell
    fields: tuple[str, ...]
    start: int
    stop: int


Match = tuple[bytes, bytes, bytes]  # a line as the scan finds it: series, value, odd line

_SERIES, _VALUE = itemgetter(0), itemgetter(1)
_new_sample = functools.partial(tuple.__new__, Sample)  # NamedTuple's own __new__ is Python


@dataclass(frozen=True, slots=True)
class Layout:
    series: list[bytes]  # every line's series as written, in order: what a body must match
    pick: itemgetter[tuple[bytes, ...]]  # the values used: the groups' in turn, then samples'
    groups: tuple[Group, ...]
    names: tuple[str, ...]  # the samples' names (the lines no cell takes)
    labels: tuple[dict[str, str], ...]  # and their labels
    first_sample: int  # where the samples' values start
    counted: tuple[int, ...]  # values of _bucket/_count samples: a negative one reads slowly
    filed: Filed
    order: tuple[int, ...]  # the lines (their numbers among the matches) pick takes, in turn
    body: bytes = b""  # the body the template was made from (_lines.fill's ``old``)
    slots: bytes | None = None  # per line of body, where its value goes in pick's order or -1


def series_of(matches: list[Match]) -> list[bytes]:
    """The lines' series, in order."""
    return list(map(_SERIES, matches))


def layout_of(series: list[bytes], matches: Sequence[Match], acc: Acc,
              hot: dict[bytes, tuple[Cell, str]],
              known: dict[bytes, Series | None], data: bytes = b"",
              pattern: re.Pattern[bytes] | None = None) -> Layout | None:
    """The layout of a body just filed into ``acc`` line by line (``hot`` and ``known`` the
    parser's caches: a series filed as read, a series returned as a sample); None where it
    could not be exact: an odd line, a series not cached, a cell whose row this refresh did not
    find, or two label dicts of one row storing one field (line order decides which wins).
    With ``data`` (the body) and ``pattern`` (the scan's), it also holds the template of
    the body for _lines.fill."""
    groups: dict[int, tuple[Cell, list[str], list[int]]] = {}
    samples: list[int] = []
    heads: list[Series] = []
    gpu: Cell | None = None
    for i, (line, _value, odd) in enumerate(matches):
        if odd:
            return None
        stored = hot.get(line)
        if stored is not None:
            cell, field = stored
            if cell.acc is not acc:
                return None
            group = groups.get(id(cell))
            if group is None:
                group = groups[id(cell)] = (cell, [], [])
            group[1].append(field)
            group[2].append(i)
            gpu = cell if cell.gpu else gpu
            continue
        head = known.get(line, MISSING)
        if head is MISSING:
            return None
        if head is not None:
            samples.append(i)
            heads.append(head)
    if not _one_writer_per_field(list(groups.values())):
        return None
    order = [i for group in groups.values() for i in group[2]] + samples
    if len(order) < 2:  # itemgetter of one index gives the value, not a tuple
        return None
    spans, start = [], 0
    for cell, fields, lines in groups.values():
        spans.append(Group(cell, tuple(fields), start, start + len(lines)))
        start += len(lines)
    names = tuple(head.name for head in heads)
    layout = Layout(
        series=series, pick=itemgetter(*order), groups=tuple(spans), names=names,
        labels=tuple(head.labels for head in heads), first_sample=start,
        counted=tuple(start + j for j, name in enumerate(names) if name.endswith(COUNT_SUFFIXES)),
        filed=Filed(start, any(not g.cell.gpu for g in spans), gpu is not None,
                    gpu.labels.get("node", "") if gpu is not None else ""),
        order=tuple(order))
    return with_template(layout, data, pattern) if pattern is not None else layout


def _one_writer_per_field(groups: list[tuple[Cell, list[str], list[int]]]) -> bool:
    """No row gets one field from two cells (whose stores, grouped, would lose line order)."""
    fields_of: dict[int, set[str]] = {}
    for cell, fields, _lines in groups:
        row = cell.row
        if row is None:
            continue
        mine = set(fields)
        theirs = fields_of.setdefault(id(row), set())
        if theirs & mine:
            return False
        theirs |= mine
    return True


def file_by_layout(layout: Layout, matches: list[Match], acc: Acc,
                   target: Target) -> tuple[list[Sample], Filed] | None:
    """Files the stored figures of a body with the layout's series into ``acc`` and returns
    its other samples, as reading line by line would; None (nothing filed) when a value needs
    reading line by line (not a number, NaN, a negative bucket or count)."""
    try:
        values = list(map(float, layout.pick(list(map(_VALUE, matches)))))
    except ValueError:
        return None
    return file_values(layout, values, acc, target)


def file_by_template(layout: Layout, data: bytes, acc: Acc,
                     target: Target) -> tuple[list[Sample], Filed] | None:
    """file_by_layout for a body that is the template's but for its values (checked and read
    in C); None (nothing filed) when it is not, or a value needs reading line by line."""
    fill = fastpath.active().fill
    if fill is None or layout.slots is None:
        return None
    values = fill(layout.body, data, layout.slots, len(layout.order))
    return None if values is None else file_values(layout, values, acc, target)


def file_values(layout: Layout, values: list[float], acc: Acc,
                target: Target) -> tuple[list[Sample], Filed] | None:
    """Files the values the layout picks (in its order) as file_by_layout does (in C where
    fastpath says so: fill_rows, the same steps)."""
    fill_rows, row_of = fastpath.active().fill_rows, row_finder()
    if fill_rows is not None:
        samples = fill_rows(layout, values, acc, target, row_of, Sample)
        return None if samples is None else (samples, layout.filed)
    if any(map(math.isnan, values)) or any(values[i] < 0 for i in layout.counted):
        return None
    for cell, fields, start, stop in layout.groups:
        row = cell.row_in(acc, target, row_of)
        if row is not None:
            row.update(zip(fields, values[start:stop], strict=True))
    samples = map(_new_sample, zip(layout.names, layout.labels, values[layout.first_sample:],
                                   strict=True))
    return list(samples), layout.filed


def with_template(layout: Layout, data: bytes, pattern: re.Pattern[bytes]) -> Layout:
    """The layout with the template of ``data``, a body with its series, for _lines.fill (the
    layout alone where there is no C half or a value picked is not its line's last token)."""
    templates = fastpath.active().fill is not None
    slots = template_slots(data, pattern, layout.order) if templates else None
    return layout if slots is None else dataclasses.replace(layout, body=data, slots=slots)


def template_slots(data: bytes, pattern: re.Pattern[bytes], order: Sequence[int]) -> bytes | None:
    """_lines.fill's slots for ``data`` (a body as scanned: a newline first and last) and the
    matches of ``pattern`` numbered in ``order``; None where a matched line's value is not its
    last token (a timestamp follows, or the line is odd).

    Why a line that differs only in its last token is scanned as the template's line was: the
    scan (expfmt's line pattern) takes one line at a time. Its verdict on a line of a name top
    drops, on a comment, or on a required name without its text (the text ends in '"', which no
    token holds) is made within the line's prefix, once that holds more than blanks. On a line
    it matched, the series runs to the last '}' (none in a token) and the value, a token with
    neither '{' nor '_', is the last token here (checked below for every line matched), so a
    new token of the same characters is read as the value in the same place."""
    slots = array("i", [-1]) * (data.count(b"\n") - 1)  # lines: each ends at the next
    slot_of = {j: k for k, j in enumerate(order)}
    number, at = 0, 0
    for j, match in enumerate(pattern.finditer(data)):
        number += data.count(b"\n", at, match.start())
        at = match.start()
        text = data[at + 1:match.end()].rstrip(b" \t")
        token = max(text.rfind(b" "), text.rfind(b"\t")) + 1
        if match.span(2) != (at + 1 + token, at + 1 + len(text)):
            return None  # picked or not: a series dropped may be read otherwise when it moves
        k = slot_of.get(j)
        if k is not None:
            slots[number] = k
    return slots.tobytes()
