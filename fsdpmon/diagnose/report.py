"""Findings as readable text: what `fsdpmon diagnose` prints and the Diagnosis view shows."""

from __future__ import annotations

from collections.abc import Sequence

from fsdpmon.diagnose.findings import Finding
from fsdpmon.diagnose.stacks import Frame, StackClass, culprit_index

MAX_STACK_FRAMES = 4  # innermost frames shown per stack class


def place(f: Finding) -> str:
    """'rank 2 · pod llama-worker-1 · node node-1 · GPU 0' (what applies)."""
    parts = [f"rank {f.rank}" if f.rank is not None else "",
             f"pod {f.pod}" if f.pod else "", f"node {f.node}" if f.node else "",
             f"GPU {f.gpu}" if f.gpu is not None else ""]
    return " · ".join(p for p in parts if p)


def finding_lines(f: Finding, frames: int = MAX_STACK_FRAMES) -> list[tuple[str, str]]:
    """(kind, text) lines of one finding: kind is 'title', 'place', 'evidence', 'stack' or
    'next', so a view can style them."""
    lines = [("title", f"{f.severity.value.upper():<8} {f.cause}: {f.summary}")]
    if place(f):
        lines.append(("place", f"  {place(f)}"))
    shown_below = {c.describe() for c in f.stacks}  # the merged stacks section says these
    lines += [("evidence", f"  - {e}") for e in f.evidence if e not in shown_below]
    if f.stacks:
        lines.append(("evidence", "  merged stacks (odd class first):"))
        for c in f.stacks:
            lines.append(("stack", f"    {c.describe()}"))
            lines += [("stack", f"      {fr.where()}") for fr in reversed(shown(c, frames))]
    lines.append(("next", f"  next: {f.next_step}"))
    return lines


def shown(c: StackClass, frames: int) -> tuple[Frame, ...]:
    """The frames under a class: from the user's innermost frame (and its caller) inwards, the
    library frames below it included, or the innermost ``frames`` if that is more."""
    start = max(0, min(len(c.frames) - frames, culprit_index(c.frames) - 1))
    return c.frames[start:]


def report_lines(findings: Sequence[Finding]) -> list[str]:
    if not findings:
        return ["no findings"]
    out: list[str] = []
    for i, f in enumerate(findings):
        if i:
            out.append("")
        out += [text for _, text in finding_lines(f)]
    return out
