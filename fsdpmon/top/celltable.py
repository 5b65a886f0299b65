"""The views' tables drawn a line at a time: the same characters and styles as rich's Table with
the settings top uses (no box, one space of padding between columns and none at the edges,
cells that never wrap and end in an ellipsis, the width filled by the flexible columns).

rich lays out every cell as a renderable of its own (a Padding around a Text, measured, then
rendered into lines and reshaped); for a screen of top's rows that is most of drawing a frame,
and a frame is drawn on every refresh. Here each cell is cut and justified with rich's own Text
methods, the column widths follow rich's own rules with its own arithmetic (rich._ratio, so
that rounding matches; a rich that moved it fails at import, one that changed it fails the
test), and each screen line is one Text. tests/test_celltable.py checks, character for
character and style for style, that both draw the same; benchmarks/bench_top.py prints both
times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich._ratio import ratio_distribute, ratio_reduce
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

_PAD = 1  # spaces each side of a cell, none at the table's edges (rich: pad_edge=False)


@dataclass(frozen=True)
class CellColumn:
    header: str
    justify: str = "right"
    min_width: int | None = None
    max_width: int | None = None
    ratio: int | None = None  # flexible: shares the width the other columns leave


class CellTable:
    """Rows of Text cells under a header row; ``__rich_console__`` draws them."""

    def __init__(self, columns: Sequence[CellColumn], header_style: str = "") -> None:
        self.columns = tuple(columns)
        self.headers = tuple(Text(c.header) for c in self.columns)
        self.header_style = header_style
        self.rows: list[tuple[tuple[Text, ...], str]] = []

    def add_row(self, *cells: Text, style: str = "") -> None:
        self.rows.append((cells, style))

    def rich_table(self) -> Table:
        """The same table as rich's Table: what this one draws like (tests, benchmarks)."""
        table = Table(box=None, padding=(0, _PAD), pad_edge=False, expand=True,
                      show_edge=False, header_style=self.header_style)
        for c in self.columns:
            table.add_column(Text(c.header), justify=c.justify,  # type: ignore[arg-type]
                             no_wrap=True, overflow="ellipsis", min_width=c.min_width,
                             max_width=c.max_width, ratio=c.ratio)
        for cells, style in self.rows:
            table.add_row(*(c.copy() for c in cells), style=style)
        return table

    def _pads(self, index: int) -> tuple[int, int]:
        return (_PAD if index > 0 else 0), (_PAD if index < len(self.columns) - 1 else 0)

    def _texts(self, index: int) -> Iterable[Text]:
        yield self.headers[index]
        for cells, _ in self.rows:
            yield cells[index]

    def _measure(self, index: int, max_width: int) -> int:
        """The widest cell plus padding, within ``max_width`` and the column's limits: rich's
        Table._measure_column for Text cells (no wrapping: a cell is as wide as its line)."""
        if max_width < 1:
            return 0
        column, (left, right) = self.columns[index], self._pads(index)
        pad = left + right
        if max_width - pad < 1:
            widest = max_width
        else:
            widest = min(max((max(map(cell_len, text.plain.splitlines()), default=0)
                              for text in self._texts(index)), default=0) + pad, max_width)
        if column.min_width is not None:
            widest = max(widest, column.min_width + pad)
        if column.max_width is not None:
            widest = min(widest, column.max_width + pad)
        return widest

    def widths(self, max_width: int) -> list[int]:
        """Each column's width with its padding: rich's Table._calculate_column_widths for
        cells that never wrap, in a table that fills ``max_width``."""
        n = len(self.columns)
        widths = [self._measure(i, max_width) or 1 for i in range(n)]
        flexible = [i for i, c in enumerate(self.columns) if c.ratio is not None]
        if any(self.columns[i].ratio for i in flexible):
            fixed = [0 if i in flexible else widths[i] for i in range(n)]
            shares = ratio_distribute(max_width - sum(fixed),
                                      [self.columns[i].ratio or 0 for i in flexible],
                                      [1 + sum(self._pads(i)) for i in flexible])
            for i, share in zip(flexible, shares, strict=True):
                widths[i] = fixed[i] + share
        if sum(widths) > max_width:  # too narrow: every column gives up the same
            widths = ratio_reduce(sum(widths) - max_width, [1] * n, widths, widths)
            widths = [self._measure(i, w) for i, w in enumerate(widths)]
        if sum(widths) < max_width and any(widths):
            widths = [w + extra for w, extra in
                      zip(widths, ratio_distribute(max_width - sum(widths), widths), strict=True)]
        return widths

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(options.max_width, options.max_width)  # it fills what it is given

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.columns:
            yield Segment("\n")
            return
        widths = self.widths(options.max_width)
        rows = [(self.headers, self.header_style, True), *((c, s, False) for c, s in self.rows)]
        for cells, style, header in rows:
            for line in self._lines(console, cells, style, widths, header):
                yield from line.render(console)
                yield Segment.line()

    def _lines(self, console: Console, cells: Sequence[Text], style: str,
               widths: Sequence[int], header: bool) -> list[Text]:
        """One row's screen lines: each cell cut and justified to its width, padded, side by
        side; a cell of fewer lines than its row's tallest is blank below (a header, above),
        in the row's style (unstyled where no cell has room inside its padding, as in rich)."""
        laid = [self._cell(console, i, cell, width, style) for i, (cell, width) in
                enumerate(zip(cells, widths, strict=True))]
        height = max(len(lines) for lines in laid)
        if height == 0:
            return [Text(" " * sum(widths), end="")]
        out = []
        for row in range(height):
            line = Text(no_wrap=True, end="")
            for lines, width in zip(laid, widths, strict=True):
                at = row - (height - len(lines)) if header else row
                line.append_text(lines[at] if 0 <= at < len(lines) else
                                 Text(" " * width, style=style))
            out.append(line)
        return out

    def _cell(self, console: Console, index: int, cell: Text, width: int,
              style: str) -> list[Text]:
        """The cell's lines, each ``width`` wide, under the row's ``style`` (none for a cell
        with no room inside its padding)."""
        left, right = self._pads(index)
        inner = width - left - right
        if inner < 1:
            return []
        justify = self.columns[index].justify
        plain = cell.plain
        if justify in _ONE_LINE and "\n" not in plain and "\t" not in plain:
            lines = [_one_line(cell, inner, justify)]
        else:
            lines = cell.wrap(console, inner, justify=justify,  # type: ignore[arg-type]
                              overflow="ellipsis", tab_size=console.tab_size or 8, no_wrap=True)
        out = []
        for line in lines or [Text("")]:
            line.truncate(inner, overflow="ellipsis", pad=True)
            padded = Text(" " * left).append_text(line).append(" " * right)
            if style:  # under the cell's own styles, as rich lays a row's style
                padded.stylize_before(style)
            out.append(padded)
        return out


_ONE_LINE = ("left", "right")


def _one_line(cell: Text, width: int, justify: str) -> Text:
    """What ``cell.wrap(..., justify, overflow="ellipsis", no_wrap=True)`` makes of a cell of
    one line without tabs, left or right justified (rich's Text.wrap and Lines.justify, step
    for step), without the Lines and the split around it: most cells of a frame are such."""
    line = cell.copy()
    if justify == "left":
        line.truncate(width, overflow="ellipsis", pad=True)
    else:
        line.rstrip()
        line.truncate(width, overflow="ellipsis")
        line.pad_left(width - cell_len(line.plain))
    line.truncate(width, overflow="ellipsis")
    return line
