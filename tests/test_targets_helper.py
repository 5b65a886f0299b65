"""The helper process that scrapes, parses and files a share of the targets: its rows are the
ones top files itself, its share comes in two parts, and a helper that dies costs only what
it had left."""

from __future__ import annotations

import time
from types import SimpleNamespace

from payload_server import PayloadServer
from synthetic_job import job_expositions
from top_snapshots import scraped_rows

from fsdpmon.scrape.sources.targets import TargetsSource


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
            assert scraped_rows(a) == scraped_rows(b), f"{view}: the split scrape's rows differ"
            assert [(t.url, t.kind, t.samples) for t in a.targets] == \
                [(t.url, t.kind, t.samples) for t in b.targets], f"{view}: targets differ"
            assert split.bytes_received == alone.bytes_received
            assert split.helper_pid is not None and split.helper_cpu_s > 0
        os.kill(split.helper_pid, signal.SIGKILL)
        hit = split.fetch()
        down = [t.url for t in hit.targets if not t.up]
        assert down == urls[1::2], f"down after the helper died: {down}"
        assert all("helper process failed" in t.error for t in hit.targets if not t.up)
        got = scraped_rows(split.fetch())
        assert got == scraped_rows(alone.fetch()), "a new helper did not take over"
    finally:
        split.close()
        alone.close()
        srv.close()


def test_the_helper_sends_most_of_its_share_first_and_its_parts_file_as_one():
    """The helper's share comes in two parts: EARLY_PART of its targets as soon as they are
    filed (the main process unpickles them while the helper files the rest), then the rest;
    the two merged are what one process files from the same targets."""
    from fsdpmon.scrape import aggregate
    from fsdpmon.scrape.filing import Acc, Target, merge
    from fsdpmon.scrape.fused import new_filing_parser
    from fsdpmon.scrape.sources import helper
    from fsdpmon.scrape.sources.cadence import SLOW_NAMES, Cadence
    from fsdpmon.scrape.wanted import WANTED

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
    want = scraped_rows(expected)
    assert scraped_rows(merged) == want, "the parts merged differ from one process's rows"


def test_a_helper_that_dies_after_its_first_part_costs_only_the_targets_it_had_left():
    """The first part's targets are filed; only the helper's others are down that refresh."""
    from fsdpmon.scrape.aggregate import JobAggregator
    from fsdpmon.scrape.sources.helper import Share

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
