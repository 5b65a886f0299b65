"""What `top` asks each target for: the names the view on screen reads (a target ignoring
name[] still works), the process and static families at their cadence, rows carried over
between the refreshes that do not ask for them, and the refresh after a rank's facts were
missing asking for everything."""

from __future__ import annotations

from payload_server import PayloadServer
from synthetic_job import job_expositions
from top_snapshots import scraped_rows

from fsdpmon.scrape.httpget import http_get
from fsdpmon.scrape.sources.targets import TargetsSource


def test_asks_only_for_the_names_top_reads_and_a_target_ignoring_that_still_works():
    """The stand-in answers ``name[]`` as the monitor and the exporter do (their own tests)."""
    payloads = job_expositions("llama", 2, 2)
    honouring = PayloadServer(payloads)
    ignoring = PayloadServer(payloads)  # answers every query with the whole exposition
    ignoring.honour_names = False
    urls = [honouring.url("/train/node-000"), honouring.url("/node/node-000")]
    try:
        full = sum(len(http_get(u, 5.0)) for u in urls)
        others = [ignoring.url("/train/node-001"), ignoring.url("/node/node-001")]
        source = TargetsSource([*urls, *others], timeout_s=5.0)
        snap, got = source.fetch(), source.bytes_received
        extra = len(payloads["/train/node-001"]) + len(payloads["/node/node-001"])
        assert got - extra < full / 2, f"{got - extra} bytes from the filtering pods of {full}"
        reference = TargetsSource([ignoring.url(p) for p in sorted(payloads)], timeout_s=5.0)
        want = scraped_rows(reference.fetch())
        assert scraped_rows(snap) == want, "the filtered scrape lost series"
        assert snap.targets_up == 4 and len(snap.ranks) == 4 and len(snap.processes) == 4
    finally:
        honouring.close()
        ignoring.close()


def test_process_and_info_families_come_every_few_refreshes_and_rows_carry_over():
    srv = PayloadServer(job_expositions("llama", 2, 2))
    source = TargetsSource([srv.url(p) for p in sorted(srv.payloads)], timeout_s=5.0)
    try:
        first = source.fetch()
        full = source.bytes_received
        between = [(source.fetch(), source.bytes_received)
                   for _ in range(source.cadence.every - 1)]
        for snap, got in between:
            assert got < full, f"{got} bytes between full refreshes of {full}"
            assert scraped_rows(snap) == scraped_rows(first), "carried process/info rows changed"
        source.fetch()
        assert source.bytes_received == full, "every SLOW_EVERY-th refresh asks for everything"
        light = between[0][1]
        source.showing("processes")
        for _ in range(2):
            snap = source.fetch()
            got = source.bytes_received
            assert light < got < full, (
                f"{got} bytes with the Processes view open: its families ({got - light} bytes "
                f"over a light refresh) but not the static facts ({full - got} bytes short)")
            assert scraped_rows(snap) == scraped_rows(first), "carried static facts changed a row"
    finally:
        source.close()
        srv.close()


def test_the_stall_threshold_is_read_fresh_on_every_refresh():
    """The published stall bound moves with the rank's position (issue 49: 25 s from entering
    a collective, 120 s or 10 x the median step elsewhere). Carried from the last full refresh,
    a rank that left a collective for a 30 s evaluation was shown stalled against its old
    25 s bound for up to SLOW_EVERY refreshes, where the rules read the new one."""
    from fsdpmon import catalog

    srv = PayloadServer(job_expositions("llama", 1, 2))
    source = TargetsSource([srv.url(p) for p in sorted(srv.payloads)], timeout_s=5.0)
    name = catalog.TRAIN_STALL_THRESHOLD_SECONDS.name.encode()
    try:
        first = source.fetch()  # the full refresh
        assert {r.stall_threshold_s for r in first.ranks} == {30.0}
        srv.payloads = {path: b"\n".join(
            line.rsplit(b" ", 1)[0] + b" 125.5" if line.startswith(name + b"{") else line
            for line in body.split(b"\n")) for path, body in srv.payloads.items()}
        light = source.fetch()
        assert not source.cadence.full
        assert {r.stall_threshold_s for r in light.ranks} == {125.5}
    finally:
        source.close()
        srv.close()


def test_a_target_without_its_static_facts_yet_is_asked_for_everything_next_refresh():
    """A job whose ranks had not published ``*_info`` at the full refresh (still starting), or
    a target that was down then, gets the slow families on the very next refresh instead of
    showing rows without node or pod for SLOW_EVERY refreshes."""
    from fsdpmon import catalog
    from fsdpmon.scrape.aggregate import ScrapeResult, Target
    from fsdpmon.scrape.expfmt import Sample
    from fsdpmon.scrape.sources.cadence import Cadence
    from fsdpmon.scrape.wanted import TRAIN_INFO, WANTED

    cadence = Cadence(every=5)
    target = Target("http://127.0.0.1:1/metrics")
    step = Sample(catalog.TRAIN_STEP.name, {"rank": "0"}, 3.0)
    info = Sample(TRAIN_INFO, {"rank": "0", "node": "n0"}, 1.0)
    assert cadence.names() == WANTED  # the first refresh asks for everything
    cadence.complete(ScrapeResult(target, [step]))  # ranks not started: no info yet
    assert cadence.names() == WANTED, "the refresh after an info-less answer asks again"
    done = cadence.complete(ScrapeResult(target, [step, info]))
    assert info in done.samples
    assert cadence.names() != WANTED, "once the facts are in, the next refresh is light"
    carried = cadence.complete(ScrapeResult(target, [step]))
    assert info in carried.samples, "the kept facts are carried into the light refresh"
    assert cadence.names() != WANTED
    cadence.complete(ScrapeResult(target, None))  # down
    assert cadence.names() == WANTED, "after a target was down, the next refresh asks for all"


def test_the_processes_view_asks_for_process_families_each_refresh_and_carries_static_facts():
    from fsdpmon import catalog
    from fsdpmon.scrape.aggregate import ScrapeResult, Target
    from fsdpmon.scrape.expfmt import Sample
    from fsdpmon.scrape.sources.cadence import PROCESS_NAMES, SLOW_NAMES, STATIC_NAMES, Cadence
    from fsdpmon.scrape.wanted import EXPORTER_INFO, PROCESS_INFO, WANTED

    cadence = Cadence(every=5)
    target = Target("http://127.0.0.1:1/metrics")
    gpu = Sample(catalog.GPU_UP.name, {"gpu": "0"}, 1.0)
    exporter = Sample(EXPORTER_INFO, {"node": "n0"}, 1.0)
    process = Sample(PROCESS_INFO, {"pid": "7", "node": "n0"}, 1.0)
    assert cadence.names() == WANTED
    cadence.complete(ScrapeResult(target, [gpu, exporter, process]))
    cadence.processes_open = True
    asked = cadence.names()
    assert asked >= PROCESS_NAMES and not STATIC_NAMES & asked, sorted(WANTED - asked)
    newer = Sample(PROCESS_INFO, {"pid": "8", "node": "n0"}, 1.0)
    done = cadence.complete(ScrapeResult(target, [gpu, newer]))
    assert done.samples == [gpu, newer, exporter], "fresh processes, the static fact carried"
    cadence.processes_open = False
    assert not cadence.names() & SLOW_NAMES and not cadence.processes_asked, "a light refresh"
    light = cadence.complete(ScrapeResult(target, [gpu]))
    assert light.samples == [gpu, exporter], "static facts carried, processes not (as rows)"


def _rss(payloads: dict[str, bytes], node: str, rss: bytes) -> None:
    """Every process of ``node``'s exporter now resident at ``rss`` bytes."""
    path = f"/node/{node}"
    lines = payloads[path].split(b"\n")
    payloads[path] = b"\n".join(
        line.rsplit(b" ", 1)[0] + b" " + rss
        if line.startswith(b"fsdpmon_process_resident_memory_bytes{") else line
        for line in lines)


def test_a_refresh_that_does_not_ask_for_processes_keeps_each_answering_nodesscraped_rows():
    """Between the refreshes that ask for the process families, each node whose exporter
    answers keeps its last process rows (the same rows, not filed again); a node whose exporter
    is down loses them, as it loses its GPU figures; a target that ignores ``name[]`` sends
    its processes anyway and they are used; the Processes view asks every refresh."""
    payloads = job_expositions("llama", 2, 2)
    srv = PayloadServer(payloads)
    source = TargetsSource([srv.url(p) for p in sorted(payloads)], timeout_s=5.0)

    def rss(snap) -> dict[str, set[float]]:
        return {n: {p.rss_bytes for p in snap.processes if p.node == n}
                for n in ("node-000", "node-001")}

    try:
        full = source.fetch()
        assert source.cadence.full and rss(full) == {"node-000": {1.2e10}, "node-001": {1.2e10}}
        _rss(payloads, "node-000", b"3e9")
        light = source.fetch()
        assert not source.cadence.processes_asked and light.processes is full.processes, \
            "a light refresh filed processes anew"
        assert [r.gpus for r in light.ranks] == [r.gpus for r in full.ranks] and \
            [g.ranks for g in light.gpus] == [g.ranks for g in full.gpus], "ties differ"
        srv.honour_names = False  # it sends everything: its fresh processes are used
        assert rss(source.fetch())["node-000"] == {3e9}, "fresh processes were not used"
        srv.honour_names = True
        gone = payloads.pop("/node/node-001")
        down = source.fetch()
        assert not source.cadence.processes_asked, "the test needs a light refresh here"
        assert rss(down) == {"node-000": {3e9}, "node-001": set()}, \
            f"a down exporter's processes stayed: {rss(down)}"
        payloads["/node/node-001"] = gone
        assert rss(source.fetch())["node-001"] == {1.2e10}, "back, after asking for all"
        _rss(payloads, "node-001", b"5e9")
        source.showing("processes")
        assert source.fetch() and rss(source.fetch())["node-001"] == {5e9}, \
            "the Processes view did not ask for processes"
    finally:
        source.close()
        srv.close()


def test_a_rank_that_starts_after_its_pods_first_gets_its_node_on_the_next_refresh():
    """Two local ranks on one endpoint: at the full refresh rank 1 steps but has not served its
    info series yet (seen in a CI run of the demo: its row without a node for SLOW_EVERY
    refreshes). The next refresh asks for the slow families again and fills it in."""
    payloads = job_expositions("llama", 1, 2)
    path = next(p for p in payloads if p.startswith("/train/"))
    complete = payloads[path]
    info = b"fsdpmon_train_info{"
    payloads[path] = b"".join(line + b"\n" for line in complete.splitlines()
                              if not (line.startswith(info) and b'rank="1"' in line))
    srv = PayloadServer(payloads)
    source = TargetsSource([srv.url(p) for p in sorted(payloads)], timeout_s=5.0)
    try:
        first = source.fetch()
        nodes = {r.rank: r.node for r in first.ranks}
        assert nodes[0] and not nodes[1], f"rank 1's info was meant to be missing: {nodes}"
        srv.payloads[path] = complete  # rank 1 publishes its facts
        second = source.fetch()
        nodes = {r.rank: r.node for r in second.ranks}
        assert nodes[1] == nodes[0], f"rank 1 still without its node the refresh after: {nodes}"
        source.fetch()
        assert source.cadence.full is False, "with every rank's facts in, refreshes are light"
    finally:
        source.close()
        srv.close()


def test_a_live_rank_without_a_node_makes_any_source_ask_for_everything_next():
    """The check lives in the cadence, so the Prometheus source gets it too: a rank that
    started after the last full refresh has no ``*_info`` yet, hence no node."""
    from dataclasses import replace

    from top_snapshots import snapshot

    from fsdpmon.scrape.sources.cadence import Cadence
    from fsdpmon.scrape.wanted import WANTED

    cadence = Cadence(every=5)
    cadence.names()
    snap = snapshot()
    assert all(r.node for r in snap.ranks), [r.rank for r in snap.ranks if not r.node]
    cadence.check(snap)
    assert cadence.names() != WANTED, "every rank has its node: a light refresh"
    gone = replace(snap, ranks=(replace(snap.ranks[0], node="", down=True), *snap.ranks[1:]))
    cadence.check(gone)
    assert cadence.names() != WANTED, "a rank that is down without a node asks for nothing"
    late = replace(snap, ranks=(replace(snap.ranks[0], node=""), *snap.ranks[1:]))
    cadence.check(late)
    assert cadence.names() == WANTED, "a live rank without its node: the next refresh asks all"
