"""Frozen dataclasses built without their generated ``__init__``, which sets each field through
``object.__setattr__`` (the frozen guard): that was most of the time spent building a
2048-rank job's rows, and 2-4 µs for each target of every refresh (its result and status).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TypeVar

try:
    from fsdpmon.top._rows import make_row
except ImportError:  # not built (no C compiler): maker's objects are made in Python
    make_row = None

R = TypeVar("R")


def maker(cls: type[R]) -> Callable[..., R]:
    """``cls(filed, **values)`` for a frozen dataclass (a row, a target's result or status),
    built without its generated __init__: this fills the new instance's ``__dict__`` at once,
    in field order: first the entries of ``filed`` (a row's accumulator) that are fields,
    taken as they are, then ``values``. The same object (==, hash, repr, asdict) as
    ``cls(**fields of filed, **values)``, which callers must all name when they have no default
    (test_snapshot checks each class)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(f.default_factory is not dataclasses.MISSING or not f.init for f in fields) or \
            hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain fields with plain defaults")
    defaults = {f.name: None if f.default is dataclasses.MISSING else f.default for f in fields}
    count, new = len(defaults), object.__new__
    # The entries that were no field of the last row with any: the same few every time (a
    # rank's accumulator keeps its planned steps, world size and RSS for the header), dropped
    # one by one for less than half of what finding them again each row costs.
    last_extras: list[tuple[str, ...]] = [()]
    if make_row is not None:  # the C half: the same steps, without a frame and a dict per row
        return functools.partial(make_row, cls, defaults, last_extras)

    def make(filed: dict[str, object] | None = None, /, **values: object) -> R:
        row = new(cls)
        slots = row.__dict__
        slots.update(defaults)
        if filed:
            slots.update(filed)
            if len(slots) != count:  # entries that are no field of the row
                for key in last_extras[0]:
                    slots.pop(key, None)
                if len(slots) != count:
                    extras = last_extras[0] = tuple(slots.keys() - defaults.keys())
                    for key in extras:
                        del slots[key]
        slots.update(values)
        return row

    return make
