"""Keys change what the user looks at: views, sort column and order, filter, quit."""

from __future__ import annotations

from fsdpmon.top.ui_state import BACKSPACE, ENTER, ESCAPE, TAB, ViewState, handle_key


def press(state: ViewState, keys: list[str]) -> ViewState:
    for key in keys:
        state = handle_key(state, key)
    return state


def test_view_switching_and_help_toggle():
    s = ViewState()
    assert press(s, ["2"]).view == "gpus" and press(s, ["3"]).view == "processes"
    assert press(s, ["4"]).view == "logs" and press(s, ["?"]).view == "help"
    assert press(s, ["?", "?"]).view == "ranks"
    assert press(s, [TAB, TAB]).view == "processes"
    assert press(s, ["x", "\x1b[A"]) == s  # unknown keys and arrows change nothing


def test_sort_cycles_columns_and_inverts():
    s = ViewState()
    assert s.sort_for("ranks") == ("rank", False)
    s = press(s, [">"])
    assert s.sort_for("ranks") == ("pod", False)
    s = press(s, ["<", "<"])
    assert s.sort_for("ranks") == ("flags", False)
    s = press(s, ["i"])
    assert s.sort_for("ranks") == ("flags", True)
    # a sort key the other view lacks falls back to that view's default
    assert press(s, ["2"]).sort_for("gpus") == ("node", False)


def test_filter_editing():
    s = press(ViewState(), ["/", "n", "o", "d", "x", BACKSPACE, "e", ENTER])
    assert s.filter == "node" and not s.editing_filter
    assert press(s, ["/", "q"]).draft == "nodeq"  # q is text while typing, not quit
    assert press(s, ["/", ESCAPE]).filter == ""
    assert press(s, [ESCAPE]).filter == ""


def test_quit_and_log_pod_selection():
    assert press(ViewState(), ["q"]).quit and press(ViewState(), ["\x03"]).quit
    assert press(ViewState(), ["]", "]", "["]).log_pod == 1
    assert press(ViewState(), ["["]).log_pod == 0
