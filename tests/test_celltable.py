"""celltable draws what rich's Table draws with top's settings: same characters, same style on
each character, on every width from far too narrow to wide, for plain, styled, empty, wide
(CJK), tabbed and multi-line cells, selected and styled rows."""

from __future__ import annotations

import io
import itertools

import pytest
from rich.console import Console, Group
from rich.segment import Segment
from rich.style import Style
from rich.text import Text

from fsdpmon.top.celltable import CellColumn, CellTable

HEADER = "bold reverse"

COLUMN_SETS = {
    "ranks": (CellColumn("▸RANK ↓"), CellColumn("POD", "left", 10, 40),
              CellColumn("NODE", "left", 6, 16), CellColumn("STEP"), CellColumn("STEP T"),
              CellColumn("FLAGS", "left", 7, None, 1)),
    "processes": (CellColumn("PID"), CellColumn("POD", "left", 4, 24),
                  CellColumn("CPU%"), CellColumn("S", "center"),
                  CellColumn("COMMAND", "left", 8, None, 2)),
    "two flexible": (CellColumn("A", "left", None, None, 1), CellColumn("B"),
                     CellColumn("C", "left", 3, None, 2)),
    "none flexible": (CellColumn("KEY", "left"), CellColumn("VALUE", "right", None, 12)),
}

CELLS = [
    Text("0"), Text("llama2-7b-worker-0"), Text(""), Text("日本語のポッド名"),
    Text("a\tb"), Text("two\nlines"), Text("3.2s", style="yellow"),
    Text.assemble(("██▌", "green"), ("      ", "dim"), " 97%"),
    Text("python -m fsdpmon.trainer.train --local-rank 7 --config /etc/fsdpmon/run.yaml " * 2),
    Text("[/x] not markup"), Text("line\u2028separator and\x1cfile separator"),
    Text.assemble(("  lead", "cyan"), ("trail   ", "bold")), Text("   ", style="red"),
]
ROW_STYLES = ["", "dim", "bold red", "yellow reverse", "dim red"]


def _rows(width: int) -> list[tuple[list[Text], str]]:
    cycle = itertools.cycle(CELLS)
    return [([next(cycle).copy() for _ in range(width)], ROW_STYLES[i % len(ROW_STYLES)])
            for i in range(12)]


def _ours(columns: tuple[CellColumn, ...], rows: list[tuple[list[Text], str]]) -> CellTable:
    table = CellTable(columns, header_style=HEADER)
    for cells, style in rows:
        table.add_row(*[c.copy() for c in cells], style=style)
    return table


def _painted(renderable: object, width: int) -> list[list[tuple[str, Style]]]:
    """Each screen line as (character, its final style): independent of how segments split."""
    console = Console(width=width, file=io.StringIO(), color_system="truecolor",
                      force_terminal=True)
    lines = console.render_lines(Group(renderable), console.options, pad=False)  # type: ignore[arg-type]
    out = []
    for line in lines:
        chars = []
        for seg in Segment.simplify(line):
            style = seg.style or Style.null()
            chars += [(ch, style) for ch in seg.text]
        out.append(chars)
    return out


@pytest.mark.parametrize("name", sorted(COLUMN_SETS))
def test_the_table_is_drawn_as_richs_table_draws_it_at_every_width(name: str) -> None:
    columns = COLUMN_SETS[name]
    rows = _rows(len(columns))
    for width in (*range(1, 40), 57, 80, 81, 120, 200, 333):
        want = _painted(_ours(columns, rows).rich_table(), width)
        got = _painted(_ours(columns, rows), width)
        assert len(got) == len(want), f"{name} at width {width}: {len(got)} lines, rich " \
                                       f"draws {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            text_a, text_b = "".join(c for c, _ in a), "".join(c for c, _ in b)
            assert text_a == text_b, f"{name} at width {width}, line {i}:\n{text_a!r}\n{text_b!r}"
            styles = [j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x[1] != y[1]]
            assert not styles, (f"{name} at width {width}, line {i}: {len(styles)} characters "
                                f"styled differently, first at {styles[0]}: "
                                f"{a[styles[0]][1]} vs rich's {b[styles[0]][1]}")


def test_a_table_without_rows_is_its_header() -> None:
    columns = COLUMN_SETS["ranks"]
    table = _ours(columns, [])
    assert _painted(table, 80) == _painted(table.rich_table(), 80)
