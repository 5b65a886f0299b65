"""Aggregation: parsed samples from many targets → the job snapshot, its state and the facts
the diagnosis names at a glance."""

from __future__ import annotations

import pytest
from rich.console import Console
from support import rounded
from top_snapshots import T0, ranks, results, snapshot

from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.diagnose import glance
from fsdpmon.job.snapshot import SPARK_WIDTH, JobState, ProcessRow
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate
from fsdpmon.scrape.rows import ties
from fsdpmon.top import fmt
from fsdpmon.top.tables import table_of
from fsdpmon.top.ui_state import ViewState


def _kinds(snap) -> set[str]:
    return {f.cause for f in glance([snap])}


def test_healthy_job_header_figures():
    snap = snapshot()
    assert snap.state is JobState.RUNNING and glance([snap]) == []
    assert snap.job_name == "llama" and snap.world_size == 4 and snap.model == "llama2-7b"
    assert snap.step == 100 and snap.total_steps == 1000 and snap.progress == rounded(0.1)
    assert snap.tokens_per_second == rounded(4 * 8192.0)
    assert snap.mfu_ratio == rounded(0.41)
    # job-level series come from rank 0's pod: median (upper, from the synthetic monitor) and max
    assert snap.step_time_max_s == rounded(0.506)
    assert snap.eta_s == rounded(900 * snap.step_time_median_s)
    assert [r.rank for r in snap.ranks] == [0, 1, 2, 3]
    assert [r.pod for r in snap.ranks] == ["llama-worker-0"] * 2 + ["llama-worker-1"] * 2
    # rank 3 is the job's slowest by 1%: no straggler by the shared line, so no SLOWEST flag
    assert snap.slowest_rank == 3 and [r.slowest for r in snap.ranks] == [0, 0, 0, 0]
    assert len(snap.gpus) == 4 and {g.node for g in snap.gpus} == {"node-0", "node-1"}
    assert len(snap.history.tokens_per_second) == 3 and len(snap.gpus[0].utilization_history) == 3
    assert [n.node for n in snap.nodes] == ["node-0", "node-1"] and snap.nodes[0].gpus == 2
    assert snap.nodes[0].simulated and snap.nodes[0].cpu_utilization_ratio == rounded(0.35)
    proc = snap.processes[0]
    assert proc.pid == 4000 and proc.pod == "llama-worker-0" and proc.gpu_memory_bytes == 60e9
    assert proc.command.startswith("python -m fsdpmon.trainer.train")


def test_a_gpu_keeps_the_utilization_its_sparkline_shows_and_no_more():
    """Each refresh adds the GPU's utilization; the row keeps the last SPARK_WIDTH, in order,
    which is what the GPU table draws (its history column is that wide)."""
    snap = None
    for i in range(SPARK_WIDTH + 5):
        util = {(0, 0): i / 100}
        snap = aggregate(results(ranks(), gpu_util=util), now=T0 + 2 * i, source="targets",
                         previous=snap)
    gpu = next(g for g in snap.gpus if (g.node, g.gpu) == ("node-0", "0"))
    expected = tuple(i / 100 for i in range(5, SPARK_WIDTH + 5))
    assert gpu.utilization_history == expected, f"{gpu.utilization_history} != {expected}"
    drawn = table_of(list(snap.gpus), "gpus", ViewState(view="gpus"), 10)
    console = Console(width=200, record=True)
    console.print(drawn)
    assert fmt.sparkline(expected, SPARK_WIDTH) in console.export_text(), \
        console.export_text()


def test_each_gpu_names_the_rank_whose_process_holds_it_and_each_rank_its_gpu():
    """NVML lists the worker's PID on its GPU; the exporter reads that worker's RANK."""
    snap = snapshot()
    held = {(g.node, g.gpu): g.ranks for g in snap.gpus}
    assert held == {("node-0", "0"): (0,), ("node-0", "1"): (1,), ("node-1", "0"): (2,),
                    ("node-1", "1"): (3,)}, held
    assert [r.gpus for r in snap.ranks] == [("node-0/0",), ("node-0/1",), ("node-1/0",),
                                            ("node-1/1",)]
    assert {p.pid: (p.rank, p.gpus) for p in snap.processes} == {
        4000: (0, ("0",)), 4001: (1, ("1",)), 4002: (2, ("0",)), 4003: (3, ("1",))}


def test_straggler_is_named_by_its_score_and_degrades_the_job():
    snap = snapshot(ranks(r2={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.9}))
    assert snap.state is JobState.DEGRADED and snap.slowest_rank == 2
    assert [r.slowest for r in snap.ranks] == [0, 0, 1, 0]
    assert "rank 2 straggles" in next(f.summary for f in glance([snap])
                                      if f.cause == "straggler_compute")


def test_a_lowest_score_above_the_threshold_flags_nobody():
    # the margin: a rank a little slower than the rest is named slowest but not flagged
    snap = snapshot(ranks(r2={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 1.05}))
    assert snap.slowest_rank == 2 and not any(r.slowest for r in snap.ranks)
    assert snap.state is JobState.RUNNING and _kinds(snap) == set()


def test_stalled_rank_from_the_monitor_flag_or_the_heartbeat():
    flagged = snapshot(ranks(r1={"stalled": True}))
    assert flagged.state is JobState.STALLED and flagged.stalled_ranks == (1,)
    aged = snapshot(ranks(r3={"heartbeat_age_s": 30.5, "stall_threshold_s": 30.0}))
    assert aged.state is JobState.STALLED and aged.stalled_ranks == (3,)
    assert "hang" in _kinds(aged)


@pytest.mark.parametrize("age, threshold, stalled", [
    (29.5, 30.0, False), (30.5, 30.0, True),
    (30.0, 30.0, False),  # older than the threshold, as the monitor's own watchdog judges
    (0.7, 0.5, True),  # a threshold under a second is one all the same
    (5.0, 0.0, False),  # no threshold (0) is no stall, however old the heartbeat
])
def test_a_heartbeat_is_stale_past_its_threshold_and_not_before(age, threshold, stalled):
    """Half a second either side of a 30 s threshold, with no flag from the monitor."""
    snap = snapshot(ranks(r2={"heartbeat_age_s": age, "stall_threshold_s": threshold}))
    assert snap.stalled_ranks == ((2,) if stalled else ()), (age, snap.stalled_ranks)
    assert (snap.state is JobState.STALLED) is stalled, snap.state


def test_the_monitors_flags_reach_the_rank_rows():
    """unresponsive, loss_nonfinite and straggling are 0/1 series: 1 sets the flag, 0 clears
    it; the monitor's straggling verdict wins over a score below the line."""
    snap = snapshot(ranks(r1={"unresponsive": True}, r2={"loss_nonfinite": True},
                          r3={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.5,
                              "straggling": False}))
    assert [r.unresponsive for r in snap.ranks] == [False, True, False, False]
    assert [r.loss_nonfinite for r in snap.ranks] == [False, False, True, False]
    assert [r.straggling for r in snap.ranks][3] is False
    assert snap.slowest_rank == 3 and not any(r.slowest for r in snap.ranks), snap.ranks


def test_the_job_history_keeps_what_the_header_draws_and_stays_bounded():
    from fsdpmon.scrape.rows import HISTORY_LEN

    snap = snapshot(refreshes=HISTORY_LEN + 5)
    for name, points in vars(snap.history).items():
        assert SPARK_WIDTH <= len(points) <= HISTORY_LEN, (name, len(points))


def _exporter(body: bytes, node: str = "n0") -> ScrapeResult:
    from fsdpmon.scrape.wanted import new_parser

    return ScrapeResult(Target(f"http://{node}:9521/metrics"), new_parser().parse(body))


def test_gpus_are_marked_simulated_only_where_the_exporter_says_so():
    """The exporter's info says whether its GPUs are simulated; a process holding one of them
    is marked, a process holding none is not, and a node heard of only through its GPU series
    (no exporter info) is no simulated one."""
    from synthetic_job import GpuSpec, exporter_exposition

    body = exporter_exposition("node-0", [GpuSpec(gpu=0, pod="p", pid=4000, rank=0)])
    idle = b"\n".join(line.replace(b'pid="4000"', b'pid="77"') for line in body.splitlines()
                      if b'pid="4000"' in line and not line.startswith(b"fsdpmon_gpu_"))
    for simulated in (True, False):
        text = body if simulated else body.replace(b'simulated="true"', b'simulated="false"')
        snap = aggregate([_exporter(text + idle + b"\n", "node-0")], now=T0, source="t")
        assert [n.simulated for n in snap.nodes] == [simulated], snap.nodes
        held = {p.pid: (p.gpus, p.gpu_simulated) for p in snap.processes}
        assert held == {4000: (("0",), simulated), 77: ((), False)}, held
    gpu_only = b'fsdpmon_gpu_utilization_ratio{gpu="0",node="n0"} 0.5\n'
    host_only = b'fsdpmon_host_cpu_utilization_ratio{cpu="all",node="n1"} 0.25\n'
    snap = aggregate([_exporter(gpu_only), _exporter(host_only, "n1")], now=T0, source="t")
    assert [(n.node, n.gpus, n.simulated) for n in snap.nodes] == [
        ("n0", 1, False), ("n1", 0, False)], snap.nodes


def test_a_gpu_its_answering_exporter_no_longer_lists_is_gone():
    """Only an exporter that stopped answering keeps its GPUs listed (marked down)."""
    two = b'fsdpmon_gpu_utilization_ratio{gpu="0",node="n0"} 0.5\n' \
          b'fsdpmon_gpu_utilization_ratio{gpu="1",node="n0"} 0.5\n'
    before = aggregate([_exporter(two)], now=T0, source="t")
    after = aggregate([_exporter(two.splitlines()[0] + b"\n")], now=T0 + 2, source="t",
                      previous=before)
    assert [(g.gpu, g.up) for g in after.gpus] == [("0", True)], after.gpus


def test_a_rank_that_goes_down_loses_its_slowest_flag():
    specs = ranks(r2={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.5})
    before = snapshot(specs)
    assert [r.slowest for r in before.ranks] == [False, False, True, False]
    after = aggregate(results(specs, down=(1,)), now=T0 + 10, source="targets",
                      previous=before)
    assert [(r.rank, r.down, r.slowest) for r in after.ranks] == [
        (0, False, False), (1, False, False), (2, True, False), (3, True, False)], after.ranks


def test_pod_that_stops_answering_is_marked_down_and_the_view_goes_on():
    specs = ranks()
    before = aggregate(results(specs), now=T0, source="targets")
    after = aggregate(results(specs, down=(1,)), now=T0 + 2, source="targets", previous=before)
    assert after.state is JobState.DEGRADED
    assert [r.down for r in after.ranks] == [False, False, True, True]
    assert after.ranks[2].step == 100  # last figures kept
    assert [g.up for g in after.gpus] == [True, True, False, False]
    assert {"target_down", "rank_missing", "gpu_lost"} <= _kinds(after)
    down = [t for t in after.targets if not t.up]
    assert len(down) == 2 and all(t.error == "timed out" for t in down)
    assert down[0].node == "node-1"


def test_nothing_answers_is_down_and_done_stays_done():
    specs = ranks()
    nothing = aggregate(results(specs, down=(0, 1)), now=T0, source="targets")
    assert nothing.state is JobState.DOWN
    finished = [s.__class__(**{**s.__dict__, "step": 1000}) for s in specs]
    done = aggregate(results(finished), now=T0, source="targets")
    assert done.state is JobState.DONE
    gone = aggregate(results(finished, down=(0, 1)), now=T0 + 2, source="targets", previous=done)
    assert gone.state is JobState.DONE


def test_memory_pressure_and_nonfinite_loss_degrade_the_job():
    snap = snapshot(ranks(r0={"peak_memory_bytes": 79e9}, r1={"loss": float("nan")}))
    assert {"memory_pressure", "loss_nonfinite"} <= _kinds(snap)
    assert snap.state is JobState.DEGRADED


def test_garbage_samples_and_unknown_targets_are_harmless():
    from fsdpmon.scrape.expfmt import Sample

    junk = [Sample("fsdpmon_train_step", {"rank": "x"}, 1.0),
            Sample("fsdpmon_gpu_utilization_ratio", {}, 0.5),
            Sample("fsdpmon_process_info", {"pid": "nope"}, 1.0)]
    snap = aggregate([ScrapeResult(Target("http://a:1/metrics"), junk)], now=T0, source="t")
    assert snap.ranks == () and snap.targets[0].up and snap.state is JobState.RUNNING
    empty = aggregate([], now=T0, source="t")
    assert empty.state is JobState.RUNNING and empty.targets == ()


def test_slowest_flag_needs_the_shared_threshold_and_does_not_flap():
    from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD as LINE

    def flagged(score: float) -> list[int]:
        snap = snapshot(ranks(r1={"straggler_score": score, "step_time_s": 0.6}))
        assert snap.slowest_rank == 1
        return [r.rank for r in snap.ranks if r.slowest]

    assert flagged(LINE * 1.01) == [], "the job's slowest rank above the line is no straggler"
    assert flagged(LINE * 0.99) == [1]
    # ranks equal to the millisecond, the job's "slowest" alternating between them: no flag
    seen = set()
    for i in range(4):
        specs = ranks(**{f"r{i % 2}": {"step_time_s": 0.5061}})
        seen |= {r.rank for r in snapshot(specs, refreshes=1).ranks if r.slowest}
    assert not seen, f"SLOWEST flapped onto ranks {sorted(seen)}"


def test_without_published_scores_the_longest_step_is_flagged_only_past_the_line():
    """A job whose monitor publishes no straggler score (an older one): the slowest rank is the
    one with the longest step, flagged when median step ÷ its own is below the shared line, and
    never against the monitor's own verdict where it publishes one."""
    from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD as LINE
    from fsdpmon.job.snapshot import RankRow
    from fsdpmon.scrape.rows import mark_slowest

    def flagged(score: float, **verdict: object) -> tuple[int | None, list[int]]:
        rows = [RankRow(rank=r, step_time_s=0.5 if r != 2 else 0.5 / score, **(
            verdict if r == 2 else {})) for r in range(4)]
        return mark_slowest(rows, {}), [r.rank for r in rows if r.slowest]

    assert flagged(LINE * 0.9) == (2, [2]), "median/own below the line"
    assert flagged(LINE * 1.1) == (2, []), "slowest, but above the line"
    assert flagged(LINE * 0.5, straggling=False) == (2, []), "the monitor's verdict wins"
    assert flagged(LINE * 1.1, straggler_score=LINE * 0.9) == (2, [2]), "its published score"
    assert flagged(1.0, straggler_score=LINE) == (2, []), "below the line, not on it"

    def slowest(times: list[float | None], down: int | None = None) -> tuple[int | None, list]:
        rows = [RankRow(rank=r, step_time_s=t, down=r == down) for r, t in enumerate(times)]
        return mark_slowest(rows, {}), [r.rank for r in rows if r.slowest]

    # two ranks are enough to compare: median 0.85 s, 0.85 / 1.2 = 0.71 is below the line
    assert slowest([0.5, 1.2]) == (1, [1])
    assert slowest([0.5]) == (None, []), "one rank has nobody to be slower than"
    assert slowest([5.0, 0.5, 0.6, 0.5], down=0) == (2, []), "a down rank is not compared"
    assert slowest([None, 0.5, 0.6, 0.5]) == (2, []), "nor one without a step time"
    # a step time of 0 (a pod's odd figure) counts as 0: median 0.5, 0.5 / 0.74 below the line
    assert slowest([0.0, 0.5, 0.5, 0.5 / (LINE * 0.9)]) == (3, [3])

    def published(rank: int) -> int | None:
        rows = [RankRow(rank=r, step_time_s=0.5 + 0.1 * r, down=r == 3) for r in range(4)]
        return mark_slowest(rows, {"slowest_rank": float(rank)})

    assert published(1) == 1, "the monitor's own choice among the live ranks"
    assert published(3) == 2, "not a down rank: the longest live step instead"


def test_gpu_fault_evidence_survives_the_scan_that_skips_idle_series():
    """The parser's scan drops inactive clock-event reasons, corrected ECC counts and per-core
    CPU lines (REQUIRE); the active reasons, the uncorrected count, XIDs and the node total
    still reach the GPU and node rows."""
    from synthetic_job import GpuSpec, exporter_exposition

    from fsdpmon.scrape.wanted import new_parser

    body = exporter_exposition("node-9", [
        GpuSpec(gpu=0, clock_events=("hw_slowdown", "sw_thermal_slowdown"), ecc_uncorrected=3,
                xids=((79, 1),)),
        GpuSpec(gpu=1)])
    samples = new_parser().parse(body)
    snap = aggregate([ScrapeResult(Target("http://n9:9400/metrics"), samples)],
                     now=0.0, source="test")
    hot, idle = snap.gpus
    assert hot.clock_events == ("hw_slowdown", "sw_thermal_slowdown"), hot.clock_events
    assert hot.ecc_uncorrected == 3 and hot.xid_counts == (("79", 1.0),), hot
    assert idle.clock_events == () and idle.ecc_uncorrected == 0 and idle.xid_counts == ()
    assert snap.nodes[0].cpu_utilization_ratio == rounded(0.35)
    masks = [s.value for s in samples if s.name == "fsdpmon_gpu_clock_event_reasons"]
    assert masks == [0x8 | 0x20, 0.0], f"one clock-event bitmask per GPU: {masks}"
    assert not [s for s in samples if s.name == "fsdpmon_gpu_clock_event_active"], \
        "the per-reason series are not read"


def test_ties_sort_many_gpus_and_processes_of_a_rank_and_many_ranks_of_a_gpu():
    """The usual case (one worker, one GPU) is taken as it is; the rest is sorted: a rank's
    GPUs by node, then by number (GPU 2 before 10), a GPU's ranks by rank, duplicates once."""
    procs = [ProcessRow(node="n1", pid=1, rank=5, gpus=("2", "10")),
             ProcessRow(node="n0", pid=2, rank=5, gpus=("3",)),
             ProcessRow(node="n1", pid=3, rank=5, gpus=("2",)),  # the same GPU again
             ProcessRow(node="n0", pid=4, rank=7, gpus=("3",)),  # shares n0/3 with rank 5
             ProcessRow(node="n0", pid=5, rank=1, gpus=("3",)),
             ProcessRow(node="n0", pid=6, rank=None, gpus=("0",)),  # not a rank's
             ProcessRow(node="n0", pid=7, rank=9, gpus=())]  # holds no GPU
    gpus_of, ranks_on = ties(procs)
    assert gpus_of == {5: ("n0/3", "n1/2", "n1/10"), 7: ("n0/3",), 1: ("n0/3",)}, gpus_of
    assert ranks_on == {("n0", "3"): (1, 5, 7), ("n1", "2"): (5,), ("n1", "10"): (5,)}, ranks_on
    # two of a kind are sorted too: one process on two GPUs, one GPU shared by two ranks
    pair = [ProcessRow(node="n2", pid=1, rank=4, gpus=("10", "2")),
            ProcessRow(node="n2", pid=2, rank=8, gpus=("5",)),
            ProcessRow(node="n2", pid=3, rank=6, gpus=("5",))]
    gpus_of, ranks_on = ties(pair)
    assert gpus_of[4] == ("n2/2", "n2/10") and ranks_on[("n2", "5")] == (6, 8), ranks_on


def test_a_process_on_several_gpus_lists_them_in_number_order():
    """The exporter's GPUs of one PID come as a set: listed in GPU order whatever the set's
    order (eight pairs: a set that happened to iterate sorted passes one in 2^8)."""
    lines = [f'fsdpmon_gpu_process_memory_used_bytes{{gpu="{g}",node="n0",pid="{pid}"}} 1e9'
             for pid in range(8) for g in (str(pid + 9), str(pid + 10))]
    lines += [f'fsdpmon_gpu_process_memory_used_bytes{{gpu="{g}",node="n0",pid="99"}} 1e9'
              for g in ("10", "2", "33", "4", "0")]
    snap = aggregate([_exporter("\n".join(lines).encode() + b"\n")], now=T0, source="t")
    held = {p.pid: p.gpus for p in snap.processes}
    assert held == {**{pid: (str(pid + 9), str(pid + 10)) for pid in range(8)},
                    99: ("0", "2", "4", "10", "33")}, held


@pytest.mark.parametrize(("served", "shown"), [
    ("72", ("hw_slowdown", "hw_thermal_slowdown")),  # 0x8 | 0x40
    ("4.0", ("sw_power_cap",)),
    ("0", ()),
    ("520", ("hw_slowdown",)),  # 0x200 has no name (a newer driver's reason): not shown
    ("NaN", ()), ("+Inf", ()), ("-4", ()), ("4.5", ()), ("1e300", ()), ("4294967296", ()),
])
def test_a_gpus_clock_event_bitmask_names_its_reasons_and_nothing_else(served, shown):
    """The bitmask a pod serves is untrusted: a value that is no 32-bit mask (not finite,
    negative, fractional, too large) shows no reason and breaks nothing."""
    body = (b'fsdpmon_gpu_utilization_ratio{gpu="0",node="n0"} 0.5\n'
            b'fsdpmon_gpu_clock_event_reasons{gpu="0",node="n0"} ' + served.encode() + b"\n")
    from fsdpmon.scrape.wanted import new_parser

    snap = aggregate([ScrapeResult(Target("http://n0:9521/metrics"), new_parser().parse(body))],
                     now=0.0, source="test")
    assert [g.clock_events for g in snap.gpus] == [shown], (served, snap.gpus)


def test_a_clock_event_mask_reads_back_as_its_reasons():
    """The exporter's mask (conventions.clock_event_mask) and top's reading of it
    (filing.clock_event_reasons) are each other's inverse; a reason named twice counts once,
    an unknown one adds nothing."""
    from fsdpmon.conventions import GPU_CLOCK_EVENT_BITS, clock_event_mask
    from fsdpmon.scrape.filing import clock_event_reasons

    for reason, bit in GPU_CLOCK_EVENT_BITS.items():
        assert clock_event_mask([reason, reason, "no_such_reason"]) == float(bit), reason
    every = clock_event_mask(GPU_CLOCK_EVENT_BITS)
    assert every == float(0x1FF), hex(int(every))
    assert clock_event_reasons(every) == tuple(GPU_CLOCK_EVENT_BITS), clock_event_reasons(every)
    assert clock_event_mask([]) == 0.0 and clock_event_reasons(0.0) == ()


def test_a_light_refresh_keeps_the_processes_of_exporters_that_answered_only():
    """A refresh that did not ask for the process families keeps the last rows of a node
    whose exporter answered; a node whose exporter is down loses them, even if its training
    pod answered."""
    from fsdpmon.job.snapshot import TargetStatus
    from fsdpmon.scrape.rows import carry_processes

    before = snapshot()
    rows = {p.node for p in before.processes}
    assert rows == {"node-0", "node-1"}, rows
    targets = [TargetStatus("http://t0/metrics", "train", up=True, node="node-0"),
               TargetStatus("http://e0/metrics", "exporter", up=False, node="node-0"),
               TargetStatus("http://e1/metrics", "exporter", up=True, node="node-1")]
    kept = carry_processes((), before, targets)
    assert {p.node for p in kept} == {"node-1"}, kept
