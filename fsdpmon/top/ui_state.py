"""What the user is looking at (view, selection, sort, filter, drill-down) and how keys change
it: pure and testable.

The keys are the ones htop, nvtop and k9s users already have in their fingers: ↑/↓ or j/k move
the selection, PgUp/PgDn/Home/End (g/G) page, Enter drills into the selected row, Esc or
Backspace goes back (and closes help), `/` filters the current view as you type, F follows the
straggler or the stalled rank. Moving needs the rows on screen: the views hand them over as a
``Nav`` (their keys in display order and the page height).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fsdpmon.top.columns import COLUMNS, DEFAULT_SORT

VIEWS = ("ranks", "gpus", "processes", "logs", "diagnosis", "help")
# Drill-down views: a rank (its processes, GPUs and log), a GPU (its processes and rank), a
# process (its details). Their subject is the key of the row they were opened from.
DETAILS = {"ranks": "rank", "gpus": "gpu", "processes": "process", "rank": "process",
           "gpu": "process"}
VIEW_KEYS = {"1": "ranks", "2": "gpus", "3": "processes", "4": "logs", "5": "diagnosis",
             "?": "help", "h": "help"}
ESCAPE, ENTER, BACKSPACE, TAB = "\x1b", "\r", "\x7f", "\t"
UP = ("\x1b[A", "\x1bOA", "k")
DOWN = ("\x1b[B", "\x1bOB", "j")
PAGE_UP, PAGE_DOWN = ("\x1b[5~",), ("\x1b[6~", " ")
HOME = ("\x1b[H", "\x1bOH", "\x1b[1~", "\x1b[7~", "g")
END = ("\x1b[F", "\x1bOF", "\x1b[4~", "\x1b[8~", "G")
FOLLOW = ("F", "f")


@dataclass(frozen=True)
class Nav:
    """The selectable rows of the current view, as shown: their keys in order, how many fit on
    the screen, and the key the view shows as selected (the followed rank when following)."""

    keys: tuple[str, ...] = ()
    page: int = 10
    current: str = ""


@dataclass(frozen=True)
class ViewState:
    view: str = "ranks"
    subject: str = ""  # the drilled-into row's key (detail views)
    sort_key: str = ""  # "" = the view's default
    descending: bool = False
    filter: str = ""  # the current view's filter
    editing_filter: bool = False
    draft: str = ""
    selected: str = ""  # the selected row's key; "" = the first row
    cursor: int = 0  # its index, kept when the row goes away
    top: int = 0  # the first row on screen
    follow: bool = False  # keep the straggler / stalled rank selected
    log_pod: int = 0  # index into the job's pods for the logs view
    other_filters: tuple[tuple[str, str], ...] = ()  # the other views' filters
    back: tuple[ViewState, ...] = field(default=(), repr=False)  # where Esc returns to
    quit: bool = False

    def sort_for(self, view: str) -> tuple[str, bool]:
        if self.sort_key and any(c.key == self.sort_key for c in COLUMNS.get(view, ())):
            return self.sort_key, self.descending
        return DEFAULT_SORT.get(view, ("", False))

    @property
    def active_filter(self) -> str:
        """What the rows are filtered by now: the draft while typing (filter as you type)."""
        return self.draft if self.editing_filter else self.filter


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
    if key == ESCAPE:  # as in htop: Esc while filtering drops the filter
        return replace(state, editing_filter=False, draft="", filter="")
    if key in (BACKSPACE, "\b"):
        return replace(state, draft=state.draft[:-1], cursor=0, top=0, selected="")
    if len(key) == 1 and key.isprintable():
        return replace(state, draft=(state.draft + key)[:64], cursor=0, top=0, selected="")
    return state


def switch_view(state: ViewState, view: str) -> ViewState:
    """Another top-level view, with its own filter; the drill-down trail is left behind."""
    filters = dict(state.other_filters)
    filters[state.view] = state.filter
    return replace(state, view=view, subject="", filter=filters.pop(view, ""),
                   other_filters=tuple(sorted((k, v) for k, v in filters.items() if v)),
                   selected="", cursor=0, top=0, back=(), editing_filter=False, draft="")


def _go_back(state: ViewState) -> ViewState:
    if state.back:
        return replace(state.back[-1], quit=state.quit)
    if state.view == "help":
        return switch_view(state, "ranks")
    return replace(state, filter="") if state.filter else state


def _open(state: ViewState, view: str, subject: str = "") -> ViewState:
    """A view stacked on the current one: Esc comes back to exactly where the user was."""
    return replace(state, view=view, subject=subject, filter="", selected="", cursor=0, top=0,
                   follow=False, editing_filter=False, draft="", back=(*state.back, state))


def _drill(state: ViewState, nav: Nav) -> ViewState:
    target = DETAILS.get(state.view)
    if target is None or not nav.current:
        return state
    return _open(replace(state, selected=nav.current), target, nav.current)


def _move(state: ViewState, nav: Nav, key: str) -> ViewState:
    n = len(nav.keys)
    if n == 0:
        return state
    page = max(1, nav.page)
    here = nav.keys.index(nav.current) if nav.current in nav.keys else min(state.cursor, n - 1)
    step = (-1 if key in UP else 1 if key in DOWN else -page if key in PAGE_UP
            else page if key in PAGE_DOWN else -n if key in HOME else n)
    index = max(0, min(n - 1, here + step))
    top = min(state.top, index)
    top = max(top, index - page + 1, 0)
    return replace(state, selected=nav.keys[index], cursor=index,
                   top=min(top, max(0, n - page)), follow=False)


MOVES = frozenset([*UP, *DOWN, *PAGE_UP, *PAGE_DOWN, *HOME, *END])


def handle_key(state: ViewState, key: str, nav: Nav | None = None) -> ViewState:
    """The state after ``key`` (one character or an escape sequence already decoded)."""
    nav = nav or Nav()
    if state.editing_filter:
        return _edit_filter(state, key)
    if key in ("q", "Q", "\x03"):
        return replace(state, quit=True)
    if key in (ESCAPE, BACKSPACE, "\b"):
        return _go_back(state)
    if key in MOVES:
        return _move(state, nav, key)
    if key in (ENTER, "\n"):
        return _drill(state, nav)
    if key in VIEW_KEYS:
        target = VIEW_KEYS[key]
        if target == "help":
            return _go_back(state) if state.view == "help" else _open(state, "help")
        return switch_view(state, target)
    if key == TAB:
        top = state.view if state.view in VIEWS else "ranks"
        return switch_view(state, VIEWS[(VIEWS.index(top) + 1) % (len(VIEWS) - 1)])
    if key in FOLLOW:
        if state.view == "ranks":
            return replace(state, follow=not state.follow)
        return replace(switch_view(state, "ranks"), follow=True)
    return _other_key(state, key)


def _other_key(state: ViewState, key: str) -> ViewState:
    if key in (">", "s"):
        return _cycle_sort(state, +1)
    if key == "<":
        return _cycle_sort(state, -1)
    if key in ("i", "I"):
        sort_key, descending = state.sort_for(state.view)
        return replace(state, sort_key=sort_key, descending=not descending)
    if key == "/":
        return replace(state, editing_filter=True, draft=state.filter)
    if key == "]":
        return replace(state, log_pod=state.log_pod + 1)
    if key == "[":
        return replace(state, log_pod=max(0, state.log_pod - 1))
    return state
