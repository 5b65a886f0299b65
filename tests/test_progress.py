"""Progress evidence: the collective wrapper's numbers, the heartbeat that carries them and the
series the pod's endpoint serves from it (what the culprit rules read)."""

from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fsdpmon import catalog
from fsdpmon.conventions import PROGRESS_PHASES
from fsdpmon.monitor import collectives
from fsdpmon.monitor.collector import JobStateCollector
from fsdpmon.monitor.heartbeat import read_heartbeat
from fsdpmon.monitor.state import RankStateWriter

NOW = 1_800_000_000.0


def test_inside_a_call_it_is_entered_not_completed_and_after_it_both():
    seen = []
    wrapped = collectives.wrap("all_reduce", lambda: seen.append(collectives.progress()))
    entered, completed, inside = collectives.progress()
    assert not inside
    wrapped()
    assert seen == [(entered + 1, completed, True)], (seen, entered, completed)
    assert collectives.progress() == (entered + 1, entered + 1, False)


def test_a_call_that_raises_is_completed_all_the_same():
    def broken():
        raise RuntimeError("peer gone")

    wrapped = collectives.wrap("broadcast", broken)
    with pytest.raises(RuntimeError):
        wrapped()
    entered, completed, inside = collectives.progress()
    assert (entered == completed, inside) == (True, False), (entered, completed)


def test_a_wait_is_inside_but_numbers_nothing():
    seen = []
    wait = collectives.wrap(None, lambda: seen.append(collectives.progress()))
    before = collectives.progress()
    wait()
    assert seen == [(before[0], before[1], True)]
    assert collectives.progress() == before


def _served(tmp_path, position) -> dict[str, dict[str, float]]:
    writer = RankStateWriter(tmp_path, 3)
    writer.snapshot({"pid": os.getpid(), "rank": 3, "local_rank": 1, "job_name": "j",
                     "values": {}})
    writer.heartbeat(NOW, 40, 40, 400, 0, 60, NOW, position)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobStateCollector(tmp_path, clock=lambda: NOW + 1))
    text = generate_latest(registry).decode()
    writer.close()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels.get("phase", "")] = s.value
    return out


def test_the_endpoint_serves_the_position_the_heartbeat_carries(tmp_path):
    backward = PROGRESS_PHASES.index("backward")
    served = _served(tmp_path, (4861.0, 4860.0, 1.0, float(backward), NOW - 90))
    assert served[catalog.TRAIN_COLLECTIVE_ENTERED_SEQ.name] == {"": 4861.0}
    assert served[catalog.TRAIN_COLLECTIVE_COMPLETED_SEQ.name] == {"": 4860.0}
    assert served[catalog.TRAIN_IN_COLLECTIVE.name] == {"": 1.0}
    assert served[catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS.name] == {"": NOW - 90}
    assert served[catalog.TRAIN_PHASE.name] == {
        p: float(p == "backward") for p in PROGRESS_PHASES}


def test_outside_a_collective_in_the_last_phase(tmp_path):
    other = len(PROGRESS_PHASES) - 1
    served = _served(tmp_path, (7.0, 7.0, 0.0, float(other), NOW - 1))
    assert served[catalog.TRAIN_IN_COLLECTIVE.name] == {"": 0.0}
    assert served[catalog.TRAIN_PHASE.name]["other"] == 1.0


@pytest.mark.parametrize("phase", [-1.0, float(len(PROGRESS_PHASES)), float("nan")])
def test_no_position_is_served_before_one_is_published_or_for_a_phase_out_of_range(
        tmp_path, phase):
    served = _served(tmp_path, (7.0, 7.0, 0.0, phase, NOW - 1))
    for metric in (catalog.TRAIN_COLLECTIVE_ENTERED_SEQ, catalog.TRAIN_PHASE,
                   catalog.TRAIN_IN_COLLECTIVE, catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS):
        assert metric.name not in served
    assert catalog.TRAIN_STEP.name in served  # the rank itself still is


def test_the_heartbeat_record_round_trips_the_position(tmp_path):
    writer = RankStateWriter(tmp_path, 0)
    writer.heartbeat(NOW, 1, 1, 1, 0, 60, NOW, (5.0, 4.0, 1.0, 2.0, NOW - 3))
    hb = read_heartbeat(writer.hb_path)
    writer.close()
    assert hb is not None
    assert (hb.collective_entered, hb.collective_completed, hb.in_collective, hb.phase,
            hb.position_since_unix) == (5.0, 4.0, 1.0, 2.0, NOW - 3)


def test_the_position_keeps_its_time_while_unchanged_and_a_step_brings_its_own(monkeypatch):
    from types import SimpleNamespace

    from fsdpmon.monitor.publish import Publication

    clock = iter([NOW - 5, NOW + 10, NOW + 20, NOW + 30])
    monkeypatch.setattr("fsdpmon.monitor.publish.time.time", lambda: next(clock))
    monkeypatch.setattr(collectives, "progress", lambda: (9, 9, False))
    pub = SimpleNamespace(phase="data", _progress=(0.0, 0.0, 0.0, 0.0), _position=(),
                          _position_since=0.0)
    assert Publication._where(pub)[4] == NOW - 5  # before the first step: the clock's time
    pub._progress = (NOW, 5.0, 5.0, 50.0)
    assert Publication._where(pub)[4] == NOW  # a step's beat: the step's own time, no clock read
    assert Publication._where(pub)[4] == NOW  # unchanged: stuck since then
    monkeypatch.setattr(collectives, "progress", lambda: (10, 9, True))
    assert Publication._where(pub)[4] == NOW + 10  # entered a collective: a watchdog's clock
    pub.phase = "forward"
    assert Publication._where(pub)[3] == PROGRESS_PHASES.index("forward")
    pub.phase = "eval"  # a loop's own name
    assert Publication._where(pub)[3] == PROGRESS_PHASES.index("other")
    pub._progress = (NOW + 99, 6.0, 6.0, 60.0)
    assert Publication._where(pub)[4] == NOW + 99


def _row(rank: int, entered: int | None, inside: bool | None):
    from fsdpmon.job.snapshot import RankRow

    return RankRow(rank=rank, collective_entered=entered, in_collective=inside)


def test_the_rank_behind_in_collectives_is_the_culprit_never_the_ones_ahead():
    from fsdpmon.diagnose.engine import progress_culprits

    rows = [_row(0, 4861, True), _row(1, 4860, False), _row(2, 4861, True), _row(3, 4861, True)]
    culprits, why = progress_culprits(rows)
    assert culprits == [1], why
    assert "#4860" in why and "#4861" in why


def test_outside_a_collective_while_others_wait_in_one_when_the_numbers_agree():
    from fsdpmon.diagnose.engine import progress_culprits

    culprits, why = progress_culprits([_row(0, 12, True), _row(1, 12, False), _row(2, 12, True)])
    assert culprits == [1], why
    assert "2 ranks wait" in why


def test_no_culprit_when_all_wait_alike_or_nothing_is_published():
    from fsdpmon.diagnose.engine import progress_culprits

    assert progress_culprits([_row(0, 12, True), _row(1, 12, True)]) == ([], "")
    assert progress_culprits([_row(0, 12, False), _row(1, 12, False)]) == ([], "")
    assert progress_culprits([_row(0, None, None), _row(1, None, None)]) == ([], "")


def test_an_older_reader_finds_the_record_whole_and_an_older_writer_has_no_position(tmp_path):
    from fsdpmon.monitor.heartbeat import HB_POSITION, HB_RECORD, HB_SIZE

    writer = RankStateWriter(tmp_path / "state", 0)
    writer.heartbeat(NOW, 1, 1, 1, 0, 60, NOW, (5.0, 4.0, 1.0, 2.0, NOW - 3))
    raw = writer.hb_path.read_bytes()
    writer.close()
    seq, pid, *_, seq_end = HB_RECORD.unpack_from(raw)  # what the record alone says
    assert (seq == seq_end, pid) == (True, os.getpid()), (seq, seq_end)
    older = tmp_path / "older.hb"  # the record alone, the rest zeros, as an older writer
    older.write_bytes(raw[:HB_RECORD.size] + b"\0" * (HB_SIZE - HB_RECORD.size))
    hb = read_heartbeat(older)
    assert hb is not None and (hb.phase, hb.position_since_unix) == (-1.0, 0.0), hb
    torn = bytearray(raw)  # the position from the write before: read as torn, never mixed
    HB_POSITION.pack_into(torn, HB_RECORD.size, 1.0, 1.0, 0.0, 0.0, NOW - 9, seq - 1)
    (tmp_path / "torn.hb").write_bytes(bytes(torn))
    assert read_heartbeat(tmp_path / "torn.hb") is None


def test_one_rank_waiting_inside_is_said_in_the_singular():
    from fsdpmon.diagnose.engine import progress_culprits

    assert progress_culprits([_row(0, 12, True), _row(1, 12, False)]) == (
        [1], "outside a collective while 1 rank wait inside one")


def test_a_verdict_says_how_much_history_it_was_drawn_from():
    from fsdpmon.diagnose.engine import judge
    from fsdpmon.job.snapshot import JobSnapshot

    history = [JobSnapshot(time=t, source="targets") for t in (100.0, 107.5, 130.25)]
    assert judge(history).seconds == 30.25, judge(history)
    assert judge(history[:1]).seconds == 0.0


def test_a_hang_without_stacks_is_named_from_the_progress_of_the_live_ranks():
    """What --prometheus has: no stacks, every rank at the same step, rank 1 a collective
    behind. It is the culprit; a down rank's stale numbers are no evidence."""
    import dataclasses

    from top_snapshots import REFRESH_S, diagnosis_history

    from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
    from fsdpmon.diagnose import diagnose

    stalled = {f"r{r}": {"stalled": True, "heartbeat_age_s": 40.0} for r in range(4)}
    snaps = diagnosis_history(lambda i: {"specs": stalled},
                              int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2)

    def at(entered: dict[int, int]) -> list:
        return [dataclasses.replace(s, ranks=tuple(
            dataclasses.replace(r, collective_entered=entered[r.rank], in_collective=True)
            for r in s.ranks)) for s in snaps]

    hangs = [f for f in diagnose(at({0: 42, 1: 41, 2: 42, 3: 42})) if f.cause == "hang"]
    assert [(f.rank, f.evidence[0]) for f in hangs] == [
        (1, "culprit: rank 1 (behind in collectives: at #41, others at #42)")], hangs
    alike = [f for f in diagnose(at({0: 42, 1: 42, 2: 42, 3: 42})) if f.cause == "hang"]
    assert [f.rank for f in alike] == [None], alike
