"""What the user is looking at (view, sort, filter) and how keys change it: pure and testable."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fsdpmon.top.columns import COLUMNS, DEFAULT_SORT

VIEWS = ("ranks", "gpus", "processes", "logs", "help")
VIEW_KEYS = {"1": "ranks", "2": "gpus", "3": "processes", "4": "logs", "?": "help", "h": "help"}
ESCAPE, ENTER, BACKSPACE, TAB = "\x1b", "\r", "\x7f", "\t"


@dataclass(frozen=True)
class ViewState:
    view: str = "ranks"
    sort_key: str = ""  # "" = the view's default
    descending: bool = False
    filter: str = ""
    editing_filter: bool = False
    draft: str = ""
    log_pod: int = 0  # index into the job's pods for the logs view
    quit: bool = False

    def sort_for(self, view: str) -> tuple[str, bool]:
        if self.sort_key and any(c.key == self.sort_key for c in COLUMNS.get(view, ())):
            return self.sort_key, self.descending
        return DEFAULT_SORT.get(view, ("", False))


def _cycle_sort(state: ViewState, step: int) -> ViewState:
    cols = COLUMNS.get(state.view)
    if not cols:
        return state
    key, descending = state.sort_for(state.view)
    keys = [c.key for c in cols]
    index = (keys.index(key) + step) % len(keys) if key in keys else 0
    return replace(state, sort_key=keys[index], descending=descending)


def _edit_filter(state: ViewState, key: str) -> ViewState:
    if key in (ENTER, "\n"):
        return replace(state, editing_filter=False, filter=state.draft)
    if key == ESCAPE:
        return replace(state, editing_filter=False, draft="", filter="")
    if key in (BACKSPACE, "\b"):
        return replace(state, draft=state.draft[:-1])
    if key.isprintable():
        return replace(state, draft=(state.draft + key)[:64])
    return state


def handle_key(state: ViewState, key: str) -> ViewState:
    """The state after ``key`` (one character or an escape sequence already decoded)."""
    if state.editing_filter:
        return _edit_filter(state, key)
    if key in ("q", "Q", "\x03"):
        return replace(state, quit=True)
    if key in VIEW_KEYS:
        target = VIEW_KEYS[key]
        return replace(state, view="ranks" if state.view == target == "help" else target)
    if key == TAB:
        return replace(state, view=VIEWS[(VIEWS.index(state.view) + 1) % len(VIEWS)])
    if key in (">", "s"):
        return _cycle_sort(state, +1)
    if key == "<":
        return _cycle_sort(state, -1)
    if key in ("i", "I"):
        sort_key, descending = state.sort_for(state.view)
        return replace(state, sort_key=sort_key, descending=not descending)
    if key == "/":
        return replace(state, editing_filter=True, draft=state.filter)
    if key == ESCAPE:
        return replace(state, filter="")
    if key == "]":
        return replace(state, log_pod=state.log_pod + 1)
    if key == "[":
        return replace(state, log_pod=max(0, state.log_pod - 1))
    return state
