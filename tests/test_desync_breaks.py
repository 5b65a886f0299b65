"""A rank's last collective pattern break (issue 51): the first call of a step that differs from
its step before's, with its call site, kept until another step breaks the pattern; published with
the rank's snapshot, served (the site as a label, whatever the state file holds), scraped into
its row. The judge's side is tests/test_desync_rules.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_monitor_collector import NOW, _exposition, _state, _values

torch = pytest.importorskip("torch")

from test_desync_fingerprint import ops_fixture  # noqa: E402, F401  (the `ops` fixture)

from fsdpmon import catalog  # noqa: E402
from fsdpmon.conventions import DTYPE_NAMES, OPS  # noqa: E402
from fsdpmon.distenv import DistEnv  # noqa: E402
from fsdpmon.monitor import collectives  # noqa: E402
from fsdpmon.monitor.config import MonitorConfig  # noqa: E402
from fsdpmon.monitor.fingerprint import (  # noqa: E402
    BREAK_SITE,
    SITE_CHARS,
    call_site,
    site_label,
    unkey,
)
from fsdpmon.monitor.publish import Publication  # noqa: E402
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate  # noqa: E402
from fsdpmon.scrape.wanted import new_parser  # noqa: E402

F32 = DTYPE_NAMES.index("float32") + 1
REDUCE, GATHER = OPS.index("all_reduce") + 1, OPS.index("all_gather_into_tensor") + 1


def run_step(ops: dict[str, object], calls: list[tuple[str, int]],
             timer: object = None) -> None:
    timer = timer or ops["timer"]
    timer.arm()  # type: ignore[attr-defined]
    for name, elements in calls:
        the_call(ops, name, elements)
    timer.step_done()  # type: ignore[attr-defined]
    timer.drain()  # type: ignore[attr-defined]


def the_call(ops: dict[str, object], name: str, elements: int) -> None:
    if name == "all_gather_into_tensor":
        ops[name](torch.zeros(elements * 2), torch.zeros(elements))  # type: ignore[operator]
    elif name == "barrier":
        ops[name]()  # type: ignore[operator]
    else:
        ops[name](torch.zeros(elements))  # type: ignore[operator]


NORMAL = [("all_gather_into_tensor", 64), ("all_reduce", 1024), ("barrier", 0)]


def test_the_first_step_and_steps_alike_record_nothing(ops):
    run_step(ops, NORMAL)  # every call is new here: no pattern to break yet
    assert collectives.last_break() is None
    run_step(ops, NORMAL)
    assert collectives.last_break() is None


def test_the_first_call_off_the_pattern_is_the_one_recorded(ops):
    run_step(ops, NORMAL)
    run_step(ops, [("all_gather_into_tensor", 64), ("all_reduce", 1), ("all_reduce", 7),
                   ("barrier", 0), ("all_reduce", 9)])
    brk = collectives.last_break()
    assert brk is not None and brk.index == 2
    assert unkey(brk.key) == (REDUCE, 1, F32) and unkey(brk.expected) == (REDUCE, 1024, F32)
    assert brk.site.startswith("test_desync_breaks.py:") and brk.site.endswith(" in the_call")


def test_an_extra_call_past_the_end_and_a_missing_call(ops):
    run_step(ops, NORMAL)
    run_step(ops, [*NORMAL, ("all_reduce", 1)])
    extra = collectives.last_break()
    assert extra.index == 4 and extra.expected is None and unkey(extra.key)[0] == REDUCE
    run_step(ops, NORMAL[:2])  # the barrier missing: no call off the pattern, one short
    short = collectives.last_break()
    assert short.index == 3 and short.key is None and unkey(short.expected)[0] == \
        OPS.index("barrier") + 1 and short.site == ""


def test_a_break_that_repeats_every_step_stays_recorded_with_its_step(ops):
    pub = Publication(MonitorConfig(port=0, job_name="j"), DistEnv(rank=1, local_rank=1),
                      {}, lambda where, exc: None)
    desynced = [*NORMAL, ("all_reduce", 1)]
    for step, calls in enumerate([NORMAL, NORMAL, desynced, desynced, desynced], start=1):
        run_step(ops, calls)
        pub.step_done(step, step, step, 0.1)
    values = pub.snapshot["values"]
    assert values[catalog.TRAIN_COLLECTIVE_BREAK_STEP.name] == 3.0
    assert values[catalog.TRAIN_COLLECTIVE_BREAK_INDEX.name] == 4.0
    assert (values[catalog.TRAIN_COLLECTIVE_BREAK_OP.name],
            values[catalog.TRAIN_COLLECTIVE_BREAK_ELEMENTS.name]) == (REDUCE, 1.0)
    assert catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_OP.name not in values  # past the end
    assert pub.snapshot[BREAK_SITE].endswith(" in the_call")
    run_step(ops, NORMAL)  # back to the old calls: a break of its own, at step 6
    pub.step_done(6, 6, 6, 0.1)
    assert values[catalog.TRAIN_COLLECTIVE_BREAK_STEP.name] == 6.0
    assert values[catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_OP.name] == REDUCE  # a call short
    assert catalog.TRAIN_COLLECTIVE_BREAK_OP.name not in values
    pub.close()


def test_a_save_between_steps_is_no_step_of_the_pattern(ops):
    from fsdpmon.monitor.checkpoint_time import CheckpointClock

    save = CheckpointClock(distributed=True)._waits  # the saves' own timer
    assert save is not None and not save.fingerprint
    run_step(ops, NORMAL)
    collectives.activate(save)
    run_step(ops, [("all_reduce", 5), ("barrier", 0)], timer=save)
    collectives.activate(ops["timer"])  # type: ignore[arg-type]
    run_step(ops, NORMAL)
    assert collectives.last_break() is None and collectives.entered_call()[3] == 0


def _frame(path: str, line: int, name: str, back: object = None) -> SimpleNamespace:
    return SimpleNamespace(f_code=SimpleNamespace(co_filename=path, co_name=name),
                           f_lineno=line, f_back=back)


def test_the_site_is_the_first_frame_outside_torch_and_the_monitor():
    user = _frame("/w/train.py", 123, "train_step", _frame("/w/main.py", 9, "main"))
    fsdp = _frame("/venv/site-packages/torch/distributed/fsdp/_fsdp.py", 50, "forward", user)
    wrapper = _frame("/src/fsdpmon/monitor/collectives.py", 270, "wrapper", fsdp)
    assert call_site(wrapper) == "train.py:123 in train_step"
    assert call_site(_frame("/venv/torch/x.py", 1, "f")) == ""  # none outside
    long = _frame("/w/" + "a" * 500 + ".py", 1, "f")
    assert len(call_site(long)) == SITE_CHARS


HOSTILE = ['x"}\nfsdpmon_train_loss{rank="9"} 1e9 \\', "a\ud800b\x00c\x1b[31m", "s" * 5000]


@pytest.mark.parametrize("site", [*HOSTILE, {"not": "text"}, 7, None])
def test_any_site_in_the_state_file_is_served_safely_and_scraped_back(site):
    values = {catalog.TRAIN_COLLECTIVE_BREAK_STEP.name: 30,
              catalog.TRAIN_COLLECTIVE_BREAK_INDEX.name: 5,
              catalog.TRAIN_COLLECTIVE_BREAK_OP.name: REDUCE}
    state = _state(0, NOW - 1, **{BREAK_SITE: site})
    state.snapshot["values"].update(values)
    text = _exposition([state])
    assert _values(text, catalog.TRAIN_COLLECTIVE_BREAK_STEP.name) == {"0": 30.0}
    served = _values(text, catalog.TRAIN_COLLECTIVE_BREAK_SITE_INFO.name)
    assert served == ({"0": 1.0} if isinstance(site, str) else {})
    assert _values(text, catalog.TRAIN_LOSS.name) == {"0": 2.5}  # nothing injected
    snap = aggregate([ScrapeResult(Target("http://p:9/metrics"),
                                   new_parser().parse(text.encode()))], now=NOW, source="targets")
    row, = snap.ranks
    assert (row.break_step, row.break_index, row.break_op) == (30, 5, REDUCE)
    if isinstance(site, str):
        assert row.break_site == site_label(site) and row.break_site.isprintable()
        assert len(row.break_site) <= SITE_CHARS and row.break_site[:1] == site[:1]
    else:
        assert row.break_site == ""


def test_a_row_without_a_break_has_none():
    snap = aggregate([ScrapeResult(Target("http://p:9/metrics"), new_parser().parse(
        _exposition([_state(0, NOW - 1)]).encode()))], now=NOW, source="targets")
    assert (snap.ranks[0].break_step, snap.ranks[0].break_site) == (None, "")
