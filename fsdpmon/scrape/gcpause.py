"""Python's cyclic garbage collector around top's refreshes.

A refresh of a large job allocates ~100k short-lived containers (samples, rows, HTTP objects);
left alone, the collector runs ~120 passes and one full pass per refresh that walks the parser's
label caches (~50 ms of a ~400 ms refresh for 2048 ranks on 2 cores). So it is held off while a
refresh runs; reference counting still frees everything at once.

In top's own process (``top_owns_this_process()``: the live view), what survives a refresh (the
new snapshot, the parser's caches) is then frozen (``gc.freeze``): the passes that drawing the
frame triggers would otherwise walk those ~30k containers again after every refresh (15 ms of a
~330 ms refresh of 2048 ranks on 2 cores; 0.2 ms frozen). Frozen objects are still freed by
reference counting as before; only a cycle among them that has become garbage waits, for every
``UNFREEZE_EVERY``-th refresh, which hands all of them back to the collector. Other processes (a
test run, a program using a source) are left as they are: freezing is process-wide.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

UNFREEZE_EVERY = 50  # refreshes: 100 s at top's default interval


class _Survivors:
    """Whether what survives a refresh is frozen, and how many refreshes have passed."""

    def __init__(self) -> None:
        self.freeze = False
        self.refreshes = 0

    def settle(self) -> None:
        if not self.freeze:
            return
        self.refreshes += 1
        if self.refreshes % UNFREEZE_EVERY == 0:
            gc.unfreeze()  # to the oldest generation: the next full pass sees their cycles
        else:
            gc.freeze()


_SURVIVORS = _Survivors()


def top_owns_this_process() -> None:
    """From now on, freeze what survives each refresh (see the module's docstring)."""
    _SURVIVORS.freeze = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """Holds off the cyclic collector for one refresh (and settles its survivors)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        _SURVIVORS.settle()
        if was_enabled:
            gc.enable()
