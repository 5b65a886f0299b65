"""Small text formatters shared by the views: sizes, rates, durations, bars and sparklines."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

_SPARKS = "▁▂▃▄▅▆▇█"
MISSING = "-"


def _ok(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def absent(value: float | None) -> str:
    """How a figure that is not a finite number is shown: a missing one as '-', NaN and the
    infinities as such (as Prometheus writes them), so a diverging loss is seen, not hidden."""
    if value is None:
        return MISSING
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def fixed(value: float | None, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if _ok(value) else absent(value)


def si(value: float | None) -> str:
    """16400 → '16.4k'."""
    if not _ok(value):
        return absent(value)
    v = float(value)  # type: ignore[arg-type]
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def size(value: float | None) -> str:
    """Bytes in binary units: 42949672960 → '40.0G'."""
    if not _ok(value):
        return absent(value)
    v = float(value)  # type: ignore[arg-type]
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}B"


def unit(value: float | None, suffix: str) -> str:
    """A whole number with its unit: '64C', '550W'."""
    return f"{value:.0f}{suffix}" if _ok(value) else absent(value)


def pct(value: float | None, digits: int = 0) -> str:
    return f"{value * 100:.{digits}f}%" if _ok(value) else absent(value)


def seconds(value: float | None) -> str:
    """A step time: '0.512s', '12.3s'."""
    if not _ok(value):
        return absent(value)
    v = float(value)  # type: ignore[arg-type]
    return f"{v:.3f}s" if v < 10 else f"{v:.1f}s"


def duration(value: float | None) -> str:
    """An ETA: '45s', '7m30s', '3h05m', '2d04h'."""
    if not _ok(value) or value < 0:  # type: ignore[operator]
        return MISSING
    s = int(value)  # type: ignore[arg-type]
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters, scaled to their own min..max."""
    data = [v for v in values if _ok(v)][-width:]
    if not data:
        return ""
    low, high = min(data), max(data)
    span = high / 2 - low / 2  # halves: the span of -1e308..1e308 would overflow to inf
    if span <= 0:
        return _SPARKS[3] * len(data)
    return "".join(_SPARKS[min(7, int((v / 2 - low / 2) / span * 7.999))] for v in data)


def level_style(ratio: float | None, warn: float, crit: float, *, high_is_bad: bool) -> str:
    """Colour for a 0..1 figure: green, yellow past ``warn``, red past ``crit``."""
    if not _ok(ratio):
        return "dim"
    r = float(ratio)  # type: ignore[arg-type]
    if high_is_bad:
        return "red" if r >= crit else "yellow" if r >= warn else "green"
    return "red" if r <= crit else "yellow" if r <= warn else "green"


def bar(ratio: float | None, width: int, style: str) -> Text:
    """A meter ``[|||||     ]`` as in htop/nvtop; empty when unknown."""
    inner = max(1, width - 2)
    if not _ok(ratio):
        return Text("[" + " " * inner + "]", style="dim")
    filled = round(max(0.0, min(1.0, float(ratio))) * inner)  # type: ignore[arg-type]
    out = Text("[")
    out.append("|" * filled, style=style)
    out.append(" " * (inner - filled))
    out.append("]")
    return out


def age(value: float | None) -> str:
    """How long ago, with a unit and a steady precision: '0.2s', '12s', '3m05s'."""
    if not _ok(value) or value < 0:  # type: ignore[operator]
        return MISSING
    v = float(value)  # type: ignore[arg-type]
    return f"{v:.1f}s" if v < 10 else duration(v)


def plural(count: int, noun: str, plural_form: str = "") -> str:
    """'1 rank', '2 ranks', '1 process', '3 processes'."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural_form or (noun + 'es' if noun.endswith('s') else noun + 's')}"


def command(text: str) -> str:
    """A command line with its program's path stripped, as nvitop shows it:
    '/work/.venv/bin/python -m fsdpmon.trainer.train' → 'python -m fsdpmon.trainer.train'."""
    program, sep, rest = text.partition(" ")
    if program.startswith("/"):
        program = program.rsplit("/", 1)[-1] or program
    return program + sep + rest
