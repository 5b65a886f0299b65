"""Keys change what the user looks at: views, sort column and order, filter, quit."""

from __future__ import annotations

from dataclasses import replace

from fsdpmon.top.ui_state import BACKSPACE, ENTER, ESCAPE, TAB, Nav, ViewState, handle_key


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
    assert press(s, ["x", "\x1b[A"]) == s  # unknown keys change nothing; so do arrows with no rows


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


def test_moving_the_selection_pages_and_keeps_it_on_screen():
    nav = Nav(keys=tuple(str(i) for i in range(50)), page=10, current="0")
    s = press(ViewState(), ["j", "j", "\x1b[B"])
    assert s == ViewState()  # without rows on screen a move does nothing
    s = ViewState()
    for key, selected, top in (("j", "1", 0), ("\x1b[6~", "11", 2), ("G", "49", 40),
                               ("k", "48", 40), ("\x1b[5~", "38", 38), ("\x1b[H", "0", 0),
                               ("\x1b[F", "49", 40), ("g", "0", 0), ("\x1b[A", "0", 0)):
        s = handle_key(s, key, replace(nav, current=s.selected or "0"))
        assert (s.selected, s.top) == (selected, top), (key, s.selected, s.top)


def test_enter_drills_down_and_escape_comes_back_to_the_same_row():
    ranks_nav = Nav(keys=("0", "1", "2"), page=10, current="2")
    s = handle_key(ViewState(selected="2", cursor=2), ENTER, ranks_nav)
    assert (s.view, s.subject) == ("rank", "2")
    s = handle_key(s, ENTER, Nav(keys=("n0/41", "n0/42"), page=5, current="n0/42"))
    assert (s.view, s.subject) == ("process", "n0/42")
    s = handle_key(s, ENTER, Nav())  # a process has nothing below it
    assert s.view == "process"
    s = handle_key(s, BACKSPACE)
    assert (s.view, s.subject, s.selected) == ("rank", "2", "n0/42")
    s = handle_key(s, ESCAPE)
    assert (s.view, s.selected, s.back) == ("ranks", "2", ())
    gpu = handle_key(ViewState(view="gpus"), ENTER, Nav(keys=("n0/1",), current="n0/1"))
    assert (gpu.view, gpu.subject) == ("gpu", "n0/1")
    assert handle_key(gpu, "3").view == "processes" and handle_key(gpu, "3").back == ()


def test_escape_closes_help_where_it_was_opened():
    s = press(ViewState(view="gpus"), ["?"])
    assert s.view == "help"
    assert press(s, [ESCAPE]).view == "gpus" and press(s, ["?"]).view == "gpus"
    assert press(s, [BACKSPACE]).view == "gpus"
    assert press(ViewState(view="help"), [ESCAPE]).view == "ranks"


def test_filter_applies_as_typed_and_only_to_its_view():
    s = press(ViewState(), ["/", "n", "o"])
    assert s.editing_filter and s.active_filter == "no" and s.filter == ""
    s = press(s, [ENTER, "3"])
    assert (s.view, s.filter) == ("processes", "")  # the ranks' filter stays with the ranks
    s = press(s, ["1"])
    assert s.filter == "no"
    assert press(s, [ESCAPE]).filter == ""  # Esc with nothing to go back to drops the filter


def test_follow_tracks_the_named_rank_until_a_move():
    s = press(ViewState(view="gpus"), ["F"])
    assert s.view == "ranks" and s.follow
    moved = handle_key(s, "j", Nav(keys=("0", "1"), page=5, current="1"))
    assert not moved.follow and moved.selected == "1"
    assert not press(s, ["F"]).follow
