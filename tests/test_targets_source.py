"""Scraping plain targets: concurrent, bounded, timed out; a bad target is marked down."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from payload_server import PayloadServer
from synthetic_job import job_expositions

from fsdpmon.errors import ConfigError
from fsdpmon.top.snapshot import JobState
from fsdpmon.top.sources.httpget import IN_FLIGHT, ScrapeError, get_all, http_get
from fsdpmon.top.sources.targets import TargetsSource, normalise_url


@pytest.fixture
def server():
    srv = PayloadServer(job_expositions("llama", 2, 2))
    srv.payloads["/garbage"] = b"\x00\xff{{{ not an exposition\n" * 1000
    yield srv
    srv.close()


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (a hung pod)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def _urls(srv: PayloadServer) -> list[str]:
    return [srv.url(p) for p in ("/train/node-000", "/node/node-000", "/train/node-001",
                                 "/node/node-001")]


def test_scrapes_every_target_into_one_snapshot(server):
    source = TargetsSource(_urls(server), timeout_s=2.0)
    try:
        snap = source.fetch()
        assert snap.state is JobState.RUNNING and snap.targets_up == 4
        assert len(snap.ranks) == 4 and len(snap.gpus) == 4 and len(snap.processes) == 4
        assert [t.kind for t in snap.targets] == ["train", "exporter"] * 2
        again = source.fetch()
        assert len(again.history.tokens_per_second) == 2
    finally:
        source.close()


def test_hung_refusing_erroring_and_garbage_targets_are_marked_down(server, silent_port):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    urls = [*_urls(server), f"127.0.0.1:{silent_port}", f"127.0.0.1:{refused}",
            server.url("/missing"), server.url("/garbage")]
    source = TargetsSource(urls, timeout_s=0.5)
    try:
        start = time.monotonic()
        snap = source.fetch()
        elapsed = time.monotonic() - start
    finally:
        source.close()
    assert elapsed < 5.0  # the hung target costs one timeout, in parallel with the rest
    by_url = {t.url: t for t in snap.targets}
    assert by_url[f"http://127.0.0.1:{silent_port}/metrics"].error == "timed out"
    assert by_url[f"http://127.0.0.1:{refused}/metrics"].error == "connection refused"
    assert "HTTP 404" in by_url[server.url("/missing")].error
    garbage = by_url[server.url("/garbage")]
    assert garbage.up and garbage.samples == 0  # unreadable text: no samples, no crash
    assert len(snap.ranks) == 4 and snap.state is JobState.DEGRADED


def test_body_limit(server):
    with pytest.raises(ScrapeError, match="larger than"):
        http_get(server.url("/train/node-000"), 2.0, max_bytes=100)


def test_url_validation():
    assert normalise_url("10.0.0.1:9520") == "http://10.0.0.1:9520/metrics"
    assert normalise_url("https://h:1/x/metrics") == "https://h:1/x/metrics"
    with pytest.raises(ConfigError, match="--targets"):
        normalise_url("ftp://h/x")
    with pytest.raises(ConfigError, match="invalid port"):
        normalise_url("h:99999")
    with pytest.raises(ConfigError):
        TargetsSource([])


def test_selector_fetch_keeps_http_get_reasons(server, silent_port):
    """The many-at-once GET (TargetsSource) reports what http_get reports, body cap included."""

    def get(url: str, max_bytes: int = 1 << 20, timeout_s: float = 2.0) -> str:
        got: list[str] = []

        def done(index: int, body: bytes | None, error: str, duration_s: float) -> None:
            got.append(error or f"{len(body or b'')} bytes")

        get_all([url], timeout_s, 4, done, max_bytes=max_bytes)
        return got[0]

    assert get(server.url("/train/node-000"), 100) == "body larger than 100 bytes"
    assert get(server.url("/missing")) == "HTTP 404 Not Found"
    assert get(f"http://127.0.0.1:{silent_port}/metrics", timeout_s=0.3) == "timed out"
    whole = http_get(server.url("/train/node-000"), 2.0)
    assert get(server.url("/train/node-000")) == f"{len(whole)} bytes"
    assert get(server.url("/garbage")) == f"{len(server.payloads['/garbage'])} bytes"


def test_https_targets_go_through_blocking_gets_beside_the_loop(server):
    """An https URL is fetched by http_get on a thread (TLS, certificate checks) while the
    plain ones share the selector loop; a failed handshake marks only that target down."""
    plain_http = socket.socket()  # answers plain HTTP at once: a TLS client must refuse it
    plain_http.bind(("127.0.0.1", 0))
    plain_http.listen(4)

    def answer() -> None:
        conn, _ = plain_http.accept()
        with conn:
            conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    tls = f"https://127.0.0.1:{plain_http.getsockname()[1]}/metrics"
    source = TargetsSource([*_urls(server)[:1], tls], timeout_s=2.0)
    try:
        snap = source.fetch()
    finally:
        source.close()
        plain_http.close()
    plain, secure = snap.targets
    assert plain.up and plain.kind == "train"
    assert not secure.up and "SSL" in secure.error


def _rows(snap) -> list[list[str]]:
    """Every row's figures, without where and when it was scraped (nor the history, which
    grows by one each refresh)."""
    where = ("seen_at", "gone_at", "target", "url")
    return [sorted(repr({k: v for k, v in asdict(row).items()
                         if k not in where and not k.endswith("_history")})
                   for row in rows) for rows in (snap.ranks, snap.gpus, snap.processes)]


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
        assert _rows(snap) == _rows(reference.fetch()), "the filtered scrape lost series"
        assert snap.targets_up == 4 and len(snap.ranks) == 4 and len(snap.processes) == 4
    finally:
        honouring.close()
        ignoring.close()


def test_process_and_info_families_come_every_few_refreshes_and_rows_carry_over():
    srv = PayloadServer(job_expositions("llama", 2, 2))
    source = TargetsSource(_urls(srv), timeout_s=5.0)
    try:
        first = source.fetch()
        full = source.bytes_received
        between = [(source.fetch(), source.bytes_received)
                   for _ in range(source.cadence.every - 1)]
        for snap, got in between:
            assert got < full, f"{got} bytes between full refreshes of {full}"
            assert _rows(snap) == _rows(first), "carried process/info rows changed"
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
            assert _rows(snap) == _rows(first), "carried static facts changed a row"
    finally:
        source.close()
        srv.close()


def test_a_target_without_its_static_facts_yet_is_asked_for_everything_next_refresh():
    """A job whose ranks had not published ``*_info`` at the full refresh (still starting), or
    a target that was down then, gets the slow families on the very next refresh instead of
    showing rows without node or pod for SLOW_EVERY refreshes."""
    from fsdpmon import catalog
    from fsdpmon.top.aggregate import ScrapeResult, Target
    from fsdpmon.top.expfmt import Sample
    from fsdpmon.top.sources.cadence import Cadence
    from fsdpmon.top.wanted import TRAIN_INFO, WANTED

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
    from fsdpmon.top.aggregate import ScrapeResult, Target
    from fsdpmon.top.expfmt import Sample
    from fsdpmon.top.sources.cadence import PROCESS_NAMES, SLOW_NAMES, STATIC_NAMES, Cadence
    from fsdpmon.top.wanted import EXPORTER_INFO, PROCESS_INFO, WANTED

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


def test_a_refresh_that_does_not_ask_for_processes_keeps_each_answering_nodes_rows():
    """Between the refreshes that ask for the process families, each node whose exporter
    answers keeps its last process rows (the same rows, not filed again); a node whose exporter
    is down loses them, as it loses its GPU figures; a target that ignores ``name[]`` sends
    its processes anyway and they are used; the Processes view asks every refresh."""
    payloads = job_expositions("llama", 2, 2)
    srv = PayloadServer(payloads)
    source = TargetsSource([srv.url(p) for p in sorted(payloads)], timeout_s=5.0, split=False)

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


def test_a_helper_process_files_half_the_targets_the_same_and_a_dead_one_costs_one_refresh():
    """A large job's targets are split with a helper process (two cores): every refresh, the
    cadence's light ones and the Processes view included, equals the one-process scrape; when
    the helper dies, only its targets are down for that refresh, then a new one takes over."""
    import os
    import signal

    payloads = job_expositions("llama", 4, 2)
    srv = PayloadServer(payloads)
    urls = [srv.url(p) for p in sorted(payloads)]
    split, alone = (TargetsSource(urls, timeout_s=5.0, split=s) for s in (True, False))
    try:
        for view in ("ranks", "ranks", "processes", "gpus", "ranks"):
            for source in (split, alone):
                source.showing(view)
            a, b = split.fetch(), alone.fetch()
            assert _rows(a) == _rows(b), f"{view}: the split scrape's rows differ"
            assert [(t.url, t.kind, t.samples) for t in a.targets] == \
                [(t.url, t.kind, t.samples) for t in b.targets], f"{view}: targets differ"
            assert split.bytes_received == alone.bytes_received
            assert split.helper_pid is not None and split.helper_cpu_s > 0
        os.kill(split.helper_pid, signal.SIGKILL)
        hit = split.fetch()
        down = [t.url for t in hit.targets if not t.up]
        assert down == urls[1::2], f"down after the helper died: {down}"
        assert all("helper process failed" in t.error for t in hit.targets if not t.up)
        assert _rows(split.fetch()) == _rows(alone.fetch()), "a new helper did not take over"
    finally:
        split.close()
        alone.close()
        srv.close()


def test_the_helper_sends_most_of_its_share_first_and_its_parts_file_as_one():
    """The helper's share comes in two parts: EARLY_PART of its targets as soon as they are
    filed (the main process unpickles them while the helper files the rest), then the rest;
    the two merged are what one process files from the same targets."""
    from fsdpmon.top import aggregate
    from fsdpmon.top.filing import Acc, Target, merge
    from fsdpmon.top.fused import new_filing_parser
    from fsdpmon.top.sources import helper
    from fsdpmon.top.sources.cadence import SLOW_NAMES, Cadence
    from fsdpmon.top.wanted import WANTED

    payloads = job_expositions("llama", 4, 2)
    srv = PayloadServer(payloads)
    targets = [Target(srv.url(p)) for p in sorted(payloads)]
    try:
        parts: list[helper.Share] = []
        last = helper._refresh(targets, new_filing_parser(SLOW_NAMES), Cadence(), 5.0, 4,
                               WANTED, parts.append)
        alone = TargetsSource([t.url for t in targets], timeout_s=5.0, split=False)
        try:
            expected, received = alone.fetch(), alone.bytes_received
        finally:
            alone.close()
    finally:
        srv.close()
    assert [p.last for p in (*parts, last)] == [False, True], "one early part, then the last"
    early = int(len(targets) * helper.EARLY_PART)
    assert len(parts[0].statuses) == early and len(last.statuses) == len(targets) - early, \
        f"parts of {len(parts[0].statuses)} and {len(last.statuses)} of {len(targets)} targets"
    assert not parts[0].statuses.keys() & last.statuses.keys(), "a target in both parts"
    assert last.received == received and last.cpu_s > 0, f"{last.received} of {received} bytes"
    acc = Acc()
    for part in (*parts, last):
        merge(acc, part.acc)
    aggregator = aggregate.JobAggregator()
    aggregator.add_filed(acc, {**parts[0].statuses, **last.statuses}, {})
    merged = aggregator.snapshot(now=expected.time, source="targets")
    assert _rows(merged) == _rows(expected), "the parts merged differ from one process's rows"


def test_a_helper_that_dies_after_its_first_part_costs_only_the_targets_it_had_left():
    """The first part's targets are filed; only the helper's others are down that refresh."""
    from fsdpmon.top.aggregate import JobAggregator
    from fsdpmon.top.sources.helper import Share

    payloads = job_expositions("llama", 4, 2)
    srv = PayloadServer(payloads)
    urls = [srv.url(p) for p in sorted(payloads)]
    split = TargetsSource(urls, timeout_s=5.0, split=True)
    try:
        split.fetch()  # starts the helper
        helper = split._helper
        helper.ask(split.cadence.names())
        first = helper.answer()
        assert isinstance(first, Share) and not first.last, f"no first part: {first!r}"
        assert helper.answer().last

        answers = iter([first, "top's helper process failed: it exited"])
        dying = SimpleNamespace(answer=lambda: next(answers))  # the first part, then its end
        aggregator = JobAggregator()
        split._take_share(dying, aggregator)  # type: ignore[arg-type]
        hit = aggregator.snapshot(now=time.time(), source="targets")
        theirs = [urls[i] for i in split._theirs]
        filed = sorted(theirs[j] for j in first.statuses)
        assert sorted(t.url for t in hit.targets if t.up) == filed, "not the first part's"
        down = [t for t in hit.targets if not t.up]
        assert sorted(t.url for t in down) == sorted(set(theirs) - set(filed)) and down
        assert all("it exited" in t.error for t in down), [t.error for t in down]
        assert split._helper is None, "the failed helper is still in use"
        helper.close()
    finally:
        split.close()
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

    from fsdpmon.top.sources.cadence import Cadence
    from fsdpmon.top.wanted import WANTED

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


@pytest.mark.parametrize("split", [False, True])
def test_a_refresh_keeps_at_most_in_flight_requests_open_at_once(split):
    """Plain-HTTP scrapes keep up to IN_FLIGHT connections open at once (so the pods' answers
    wait in the kernel while top parses), never more, whether or not a helper process takes
    half of the targets (each then keeps half)."""
    from test_httpget import RawServer

    srv = RawServer(b"HTTP/1.0 200 OK\r\n\r\nm 1\n", delay_s=0.2)
    source = TargetsSource([f"{srv.url}?n={i}" for i in range(IN_FLIGHT + 32)], timeout_s=10.0,
                           split=split)
    try:
        snap = source.fetch()
        assert snap.targets_up == IN_FLIGHT + 32, [t.error for t in snap.targets if not t.up]
        assert srv.served == IN_FLIGHT + 32, srv.served
        # each answer waits 0.2 s, so every connection allowed is open by then
        assert IN_FLIGHT // 2 < srv.most_open <= IN_FLIGHT, (srv.most_open, IN_FLIGHT)
        assert (source.helper_pid is not None) is split
    finally:
        source.close()
        srv.close()
