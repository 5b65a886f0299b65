"""Stack evidence of a stalled job: the `/stacks` documents the ranks publish, read without
trust, and merged into classes the way LLNL's STAT does (ranks with the same stack and the same
last collective are one class), the odd class out first.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_FRAMES = 64  # per rank: deeper stacks are cut at the innermost end kept
MAX_TEXT = 200  # file / function names longer than this are cut


# Frames not of the user's code: the standard library, installed packages, the interpreter's
# own (<frozen ...>, <string>) and the monitor's. A hang's culprit frame is the innermost other
# one: where the user's code called what never returned (threading.py's wait says nothing).
_LIBRARY = re.compile(r"/site-packages/|/dist-packages/|/lib/python\d+(?:\.\d+)?/|^<|"
                      r"/fsdpmon/monitor/")


class Frame(NamedTuple):  # a tuple: 2048 stacks of ~20 frames hash in C when merged
    file: str
    line: int
    function: str

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} {self.function}"

    @property
    def in_user_code(self) -> bool:
        return not _LIBRARY.search(self.file)


def culprit_index(frames: tuple[Frame, ...]) -> int:
    """The innermost frame of the user's code (the innermost frame when none is)."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].in_user_code:
            return i
    return len(frames) - 1


@dataclass(frozen=True)
class RankStack:
    rank: int
    step: int | None = None
    phase: str = ""
    stalled: bool = False
    op: str = ""  # last collective's op ("" before the first one)
    seq: int | None = None  # last collective's sequence number
    frames: tuple[Frame, ...] = ()  # outermost first


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _frames(raw: Any) -> tuple[Frame, ...]:
    if not isinstance(raw, list):
        return ()
    out = [Frame(_text(f.get("file")), _int(f.get("line")) or 0, _text(f.get("function")))
           for f in raw if isinstance(f, dict)]
    return tuple(out[-MAX_FRAMES:])


def parse_stacks(doc: Any) -> list[RankStack]:
    """One `/stacks` document → its ranks; malformed entries are skipped, never raised."""
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    out = []
    for entry in ranks if isinstance(ranks, list) else ():
        if not isinstance(entry, dict) or _int(entry.get("rank")) is None:
            continue
        last = entry.get("last_collective")
        last = last if isinstance(last, dict) else {}
        out.append(RankStack(
            rank=_int(entry["rank"]), step=_int(entry.get("step")),  # type: ignore[arg-type]
            phase=_text(entry.get("phase")), stalled=entry.get("stalled") is True,
            op=_text(last.get("op")), seq=_int(last.get("seq")),
            frames=_frames(entry.get("frames"))))
    return out


@dataclass(frozen=True)
class StackClass:
    """Ranks that share one stack and one last collective."""

    ranks: tuple[int, ...]
    frames: tuple[Frame, ...]
    op: str
    seq: int | None
    step: int | None

    @property
    def culprit(self) -> Frame | None:
        """The innermost frame of the user's code; the frames below it stay in ``frames``."""
        return self.frames[culprit_index(self.frames)] if self.frames else None

    def describe(self) -> str:
        """'2047 ranks at train.py:88 step in fsdp.py:12 wait (step 812, last collective #219
        all_gather_into_tensor)': the user's innermost frame, then the innermost of all."""
        who = f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"{len(self.ranks)} ranks"
        culprit = self.culprit
        where = culprit.where() if culprit else "no stack published"
        if culprit is not None and culprit is not self.frames[-1]:
            where += f" in {self.frames[-1].where()}"
        coll = f"collective #{self.seq} {self.op}" if self.seq is not None else "no collective yet"
        step = f"step {self.step}, " if self.step is not None else ""
        return f"{who} at {where} ({step}last {coll})"

    def to_dict(self) -> dict[str, Any]:
        culprit = self.culprit
        return {"ranks": list(self.ranks), "count": len(self.ranks), "op": self.op,
                "seq": self.seq, "step": self.step,
                "culprit_frame": None if culprit is None else {
                    "file": culprit.file, "line": culprit.line, "function": culprit.function},
                "frames": [{"file": f.file, "line": f.line, "function": f.function}
                           for f in self.frames]}


def merge(stacks: Iterable[RankStack]) -> list[StackClass]:
    """Classes by (stack, last collective); the odd one first: the class furthest behind in
    collectives (it never joined the one the others wait in), then the smallest."""
    groups: dict[tuple[tuple[Frame, ...], int | None, str], list[RankStack]] = {}
    for s in stacks:
        groups.setdefault((s.frames, s.seq, s.op), []).append(s)
    classes = [StackClass(tuple(sorted(s.rank for s in members)), key[0], key[2], key[1],
                          min((s.step for s in members if s.step is not None), default=None))
               for key, members in groups.items()]
    return sorted(classes, key=lambda c: (-1 if c.seq is None else c.seq, len(c.ranks),
                                          c.ranks[0]))
