"""The one place that chooses, for each C half of the scrape layer, whether it or its Python
twin serves.

The C halves are optional extensions the install builds from ``fsdpmon/scrape/_*.c`` (a machine
without a C compiler goes on without them). Each does what a Python function does, step for
step, only faster; the Python twin stays as the fallback and as the tests' reference:

==============  =====================  ===================================================
part            C                      Python twin
==============  =====================  ===================================================
``fill``        ``_lines.fill``        a body read line by line (no template: layout.py)
``fill_rows``   ``_lines.fill_rows``   ``layout.file_values``'s loop
``filing``      ``_filing``            ``filing.file_result``'s loop and ``filing.row_of``
``rows``        ``_rows.make_row``     ``frozen.maker``'s ``make``
==============  =====================  ===================================================

``FSDPMON_PURE_PYTHON=1`` makes every part Python's (``scripts/test.sh`` runs the parse, filing
and ``top`` tests a second time so: what a machine without a compiler runs). A comma-separated
list of parts (``FSDPMON_PURE_PYTHON=fill_rows,filing``) makes those Python's only: that is
how ``benchmarks/bench_top.py`` measures what each part buys.

Modules ask ``active()`` at each call (once per body or per target), never at import, and import
no C module themselves; a test that compares the halves chooses explicitly with ``using``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fsdpmon.errors import ConfigError

SWITCH = "FSDPMON_PURE_PYTHON"

CFunction = Callable[..., Any]


@dataclass(frozen=True)
class Halves:
    """The C functions that serve (None: the Python twin serves that part)."""

    fill: CFunction | None = None  # a body against its target's last one: its values or None
    fill_rows: CFunction | None = None  # a layout's values stored in their rows
    file_samples: CFunction | None = None  # filing.file_result's loop
    row_of: CFunction | None = None  # filing.row_of
    make_row: CFunction | None = None  # frozen.maker's make

    def any(self) -> bool:
        """Whether some part is C."""
        return any(getattr(self, part) is not None for part in PARTS)

    def without(self, parts: set[str]) -> Halves:
        """These halves with ``parts`` made Python's."""
        return dataclasses.replace(self, **{part: None for part in parts})


PYTHON = Halves()
# The switch's part names (``filing`` is the loop and row_of together: row_of's C rows are the
# ones the C loop memoises) → the fields they clear.
PARTS = ("fill", "fill_rows", "file_samples", "row_of", "make_row")
_SWITCH_PARTS = {"fill": {"fill"}, "fill_rows": {"fill_rows"},
                 "filing": {"file_samples", "row_of"}, "rows": {"make_row"}}


def _extension(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"fsdpmon.scrape.{name}")
    except ImportError:  # not built: no C compiler where it was installed
        return None


@functools.cache
def built() -> Halves:
    """Every C half built here, whatever the switch says (what tests compare Python with)."""
    lines, filing, rows = _extension("_lines"), _extension("_filing"), _extension("_rows")
    return Halves(
        fill=lines.fill if lines else None, fill_rows=lines.fill_rows if lines else None,
        file_samples=filing.file_samples if filing else None,
        row_of=filing.row_of if filing else None, make_row=rows.make_row if rows else None)


def chosen(switch: str | None) -> Halves:
    """The halves that serve under the switch's value (unset or empty: every one built)."""
    text = (switch or "").strip()
    if not text:
        return built()
    if text == "1":
        return PYTHON
    parts = {part.strip() for part in text.split(",") if part.strip()}
    unknown = parts - _SWITCH_PARTS.keys()
    if unknown:
        raise ConfigError(SWITCH, f"unknown part(s) {', '.join(sorted(unknown))}: give 1 or "
                                  f"a comma-separated list of {', '.join(_SWITCH_PARTS)}")
    return built().without(set().union(*(_SWITCH_PARTS[p] for p in parts)))


def setup_filing(*tables: object) -> None:
    """Hands filing.py's tables to the C loop, where it is built (filing.py, at its import)."""
    filing = _extension("_filing")
    if filing is not None:
        filing.setup(*tables)


_active: list[Halves] = []


def active() -> Halves:
    """The halves serving now: the switch's choice, or what ``using`` chose."""
    if not _active:
        _active.append(chosen(os.environ.get(SWITCH)))
    return _active[-1]


@contextmanager
def using(halves: Halves) -> Iterator[Halves]:
    """Serves with ``halves`` inside the block (tests comparing C with Python, either switch)."""
    active()
    _active.append(halves)
    try:
        yield halves
    finally:
        _active.pop()
