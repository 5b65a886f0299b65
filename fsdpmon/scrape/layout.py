"""A target's layout: where each line's value of its last body goes, and that body as the
template of the next; a later body that is the template but for its values is filed from its
values alone.

A pod serves the same series every refresh; only the values change. Read line by line, each
line costs a loop turn in Python (a lookup, a float, a store). Checked against the template, the
whole body costs one pass in C (_lines.fill: the bytes compared but for each line's last token,
the values read), then each row's figures are stored (_lines.fill_rows, or its Python twin
here) and the other samples made in one go (benchmarks/bench_top.py prints what each part
buys). The result is what reading line by line gives, or nothing (then the body is read line by
line): a layout is only made when it can be exact, and only used when every value reads as the
line-by-line reading would take it. Without the C half of ``fill`` no layout is made: comparing
a body's series in Python bought nothing over reading it line by line (1.00x, bench_top).
"""

from __future__ import annotations

import functools
import math
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    a body's values in the layout's order (``start`` to ``stop``)."""

    cell: Cell
    fields: tuple[str, ...]
    start: int
    stop: int


Match = tuple[bytes, bytes, bytes]  # a line as the scan finds it: series, value, odd line

_new_sample = functools.partial(tuple.__new__, Sample)  # NamedTuple's own __new__ is Python


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the values of a target's bodies go: first each cell's (its row's fields), then the
    other samples'; _lines.fill_rows reads these fields by name."""

    groups: tuple[Group, ...]
    names: tuple[str, ...]  # the samples' names (the lines no cell takes)
    labels: tuple[dict[str, str], ...]  # and their labels
    first_sample: int  # where the samples' values start
    counted: tuple[int, ...]  # values of _bucket/_count samples: a negative one reads slowly
    filed: Filed
    order: tuple[int, ...]  # the lines (their numbers among the matches) taken, in turn
    body: bytes  # the body the template was made from (_lines.fill's ``old``)
    slots: bytes  # per line of body, where its value goes in ``order`` or -1


def layout_of(matches: Sequence[Match], acc: Acc, hot: dict[bytes, tuple[Cell, str]],
              known: dict[bytes, Series | None], data: bytes,
              pattern: re.Pattern[bytes]) -> Layout | None:
    """The layout of ``data``, a body just filed into ``acc`` line by line (``matches``: the
    scan's, ``pattern``; ``hot`` and ``known`` the parser's caches: a series filed as read, a
    series returned as a sample), with the body as its template; None where it could not be
    exact: an odd line, a series not cached, a cell whose row this refresh did not find, two
    label dicts of one row storing one field (line order decides which wins), or a value that
    is not its line's last token."""
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
    spans, start = [], 0
    for cell, fields, lines in groups.values():
        spans.append(Group(cell, tuple(fields), start, start + len(lines)))
        start += len(lines)
    slots = template_slots(data, pattern, order)
    if slots is None:
        return None
    names = tuple(name for name, _labels in heads)
    return Layout(
        groups=tuple(spans), names=names, labels=tuple(labels for _name, labels in heads),
        first_sample=start,
        counted=tuple(start + j for j, name in enumerate(names) if name.endswith(COUNT_SUFFIXES)),
        filed=Filed(start, any(not g.cell.gpu for g in spans), gpu is not None,
                    gpu.labels.get("node", "") if gpu is not None else ""),
        order=tuple(order), body=data, slots=slots)


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


def template_values(layout: Layout, data: bytes) -> list[float] | None:
    """The values of ``data`` in the layout's order, where it is the layout's template but for
    them (checked and read in C: _lines.fill); None where it is not, or no C half serves."""
    fill = fastpath.active().fill
    return None if fill is None else fill(layout.body, data, layout.slots, len(layout.order))


def file_values(layout: Layout, values: list[float], acc: Acc,
                target: Target) -> tuple[list[Sample], Filed] | None:
    """Files a body's values (in the layout's order) into ``acc`` and returns its other samples,
    as reading it line by line would (in C where fastpath says so: fill_rows, the same steps);
    None (nothing filed) when a value needs reading line by line (NaN, a negative bucket or
    count)."""
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
