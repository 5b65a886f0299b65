"""One header line made of parts that are dropped whole, least important first, until the line
fits the terminal: at 80 columns the clock or a figure is either shown or left out, never cut
mid-word (`02:16:…`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

KEEP = 100  # parts with this priority stay even when the line must be cut


@dataclass(frozen=True)
class Part:
    text: Text | str
    priority: int = KEEP  # lower goes first when space runs out

    @property
    def as_text(self) -> Text:
        return self.text if isinstance(self.text, Text) else Text(self.text)


def fit(parts: Iterable[Part], width: int) -> Text:
    """The parts, in order, after dropping the least important ones until they fit."""
    kept = [p for p in parts if p.as_text.cell_len]
    while sum(p.as_text.cell_len for p in kept) > width:
        optional = [p for p in kept if p.priority < KEEP]
        if not optional:
            break
        kept.remove(min(optional, key=lambda p: p.priority))
    line = Text(no_wrap=True, overflow="ellipsis")
    for p in kept:
        line.append_text(p.as_text)
    return line


class FittedLine:
    """A renderable line of parts that fits whatever width the console gives it."""

    def __init__(self, *parts: Part, style: str = "") -> None:
        self.parts, self.style = parts, style

    def plain(self, width: int = 10_000) -> str:
        return fit(self.parts, width).plain

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = fit(self.parts, options.max_width)
        if self.style:
            line.stylize(self.style)
        yield line


def cut_at_word(text: str, width: int) -> str:
    """``text`` if it fits, else up to the last whole word that fits, then '…'."""
    if len(text) <= width:
        return text
    head = text[:max(0, width - 1)]
    space = head.rfind(" ")
    if space > width // 2:  # a word boundary not too far back; else cut where it must
        head = head[:space].rstrip(" ,·:")
    return head + "…"


class WordCutLine:
    """A line (an alert) that, when too long, ends after its last whole word with '…'."""

    def __init__(self, text: str, style: str = "") -> None:
        self.text, self.style = text, style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(cut_at_word(self.text, options.max_width), style=self.style, no_wrap=True,
                   overflow="crop")
