"""The Diagnosis view (key 5) and the header's diagnosis lines: the engine's findings with
their evidence and merged stacks, and in the header the top finding in words with what the
latest refresh shows before a finding confirms it. Pure, like the other views.
"""

from __future__ import annotations

import textwrap

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.text import Text

from fsdpmon.conventions import Severity
from fsdpmon.diagnose import Verdict
from fsdpmon.diagnose.report import finding_lines
from fsdpmon.top.fitted import WordCutLine

STYLES = {"place": "bold", "evidence": "", "stack": "cyan", "next": "green"}
TITLE_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "bold yellow"}
HEADER_STYLE = {Severity.CRITICAL: "bold red", Severity.WARNING: "yellow"}
MAX_HEADER_LINES = 3


def header_line(verdict: Verdict | None) -> Text | None:
    """'! hang: rank 2 holds up 3 ranks (+1 more: 5 Diagnosis)', or None with no finding."""
    if verdict is None or not verdict.findings:
        return None
    top = verdict.findings[0]
    more = len(verdict.findings) - 1
    text = f"! {top.cause}: {top.summary}" + (f" (+{more} more: 5 Diagnosis)" if more else "")
    return Text(text, style=HEADER_STYLE[top.severity], no_wrap=True, overflow="ellipsis")


def verdict_lines(verdict: Verdict | None) -> list[RenderableType]:
    """The header's diagnosis: the top finding, then what the latest refresh shows that no
    finding confirms yet ('! rank 5 stalled: no step within the threshold'), MAX_HEADER_LINES
    in all, and how many more there are."""
    top = header_line(verdict)
    lines: list[RenderableType] = [top] if top is not None else []
    glance = verdict.glance if verdict is not None else ()
    room = MAX_HEADER_LINES - len(lines)
    lines += [WordCutLine(f"! {f.summary}", HEADER_STYLE[f.severity]) for f in glance[:room]]
    if len(glance) > room:
        lines.append(Text(f"! +{len(glance) - room} more alerts", style="red"))
    return lines


class DiagnosisPane:
    """The findings, wrapped to the terminal's width and cut to ``height`` lines (the last
    line then says how many were left out). Text only: evidence carries untrusted names."""

    def __init__(self, verdict: Verdict | None, height: int) -> None:
        self.verdict, self.height = verdict, max(1, height)

    def lines(self, width: int) -> list[Text]:
        v = self.verdict
        if v is None or (v.gathering and not v.findings):
            seen = 0.0 if v is None else v.seconds
            span = 0.0 if v is None else v.span_s
            return [Text(f"gathering evidence: {seen:.0f}s of the {span:.0f}s a verdict needs",
                         style="dim")]
        if not v.findings:
            return [Text(f"no findings: nothing wrong held for {v.span_s:.0f}s in a row",
                         style="green")]
        out: list[Text] = []
        for i, f in enumerate(v.findings):
            if i:
                out.append(Text(""))
            for kind, text in finding_lines(f):
                style = TITLE_STYLE[f.severity] if kind == "title" else STYLES[kind]
                indent = " " * (len(text) - len(text.lstrip()) + (2 if kind != "title" else 9))
                for piece in textwrap.wrap(text, width, subsequent_indent=indent) or [""]:
                    out.append(Text(piece, style=style))
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self.lines(max(20, options.max_width))
        if len(lines) > self.height:
            left = len(lines) - self.height + 1
            lines = [*lines[:self.height - 1],
                     Text(f"… {left} more lines (fsdpmon diagnose prints them all)", style="dim")]
        for line in lines:
            line.no_wrap, line.overflow = True, "ellipsis"
            yield line
