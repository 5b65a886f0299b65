"""The context managers a training loop wraps its steps and phases in: one object per step or
phase name, reused every step, so that a step costs no allocation."""

from __future__ import annotations

from collections.abc import Callable


class Span:
    __slots__ = ("_abort", "_enter", "_exit")

    def __init__(self, enter: Callable[[], None], exit_: Callable[[], None],
                 abort: Callable[[], None] | None = None) -> None:
        self._enter, self._exit, self._abort = enter, exit_, abort or exit_

    def __enter__(self) -> None:
        self._enter()

    def __exit__(self, exc_type: object, *exc: object) -> bool:
        if exc_type is None:
            self._exit()
        else:
            self._abort()  # e.g. an OOM the loop catches and skips: not a completed step
        return False  # never swallow the training loop's own exceptions
