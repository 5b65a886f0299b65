"""Frozen dataclasses built without their generated ``__init__``, which sets each field through
``object.__setattr__`` (the frozen guard): that was most of the time spent building a
2048-rank job's rows, and 2-4 µs for each target of every refresh (its result and status).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def maker(cls: type[R]) -> Callable[..., R]:
    """``cls(filed, **values)`` for a frozen dataclass (a row, a target's result or status),
    built without its generated __init__: the new instance's ``__dict__`` is ``filed`` itself
    (a row's accumulator, taken over rather than copied: a copy cost as much again, and its
    values were then released twice, once with each dict), or a new dict; each field it lacks
    gets its default, then ``values`` are set. The same object (==, hash, repr, asdict) as
    ``cls(**fields of filed, **values)``, which callers must all name when they have no
    default; entries of ``filed`` that are no field (filing's bookkeeping, e.g. a rank's
    planned steps) stay in ``__dict__`` but take no part in any of those (test_snapshot checks
    each class). ``filed`` must not be changed afterwards: it is the object's state."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(f.default_factory is not dataclasses.MISSING or not f.init for f in fields) or \
            hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: only plain fields with plain defaults")
    defaults = {f.name: None if f.default is dataclasses.MISSING else f.default for f in fields}
    new, setattr_ = object.__new__, object.__setattr__

    def make(filed: dict[str, object] | None = None, /, **values: object) -> R:
        row = new(cls)
        if filed is None:
            slots = dict(defaults)
        else:
            slots = filed
            for key, default in defaults.items():
                slots.setdefault(key, default)
        slots.update(values)
        setattr_(row, "__dict__", slots)
        return row

    return make
