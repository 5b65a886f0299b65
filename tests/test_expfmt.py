"""The fast exposition parser: same samples as prometheus_client, tolerant of anything."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from synthetic_job import job_expositions

from fsdpmon.top.aggregate import WANTED
from fsdpmon.top.expfmt import Parser, parse, parse_labels


def _reference(text: str) -> list[tuple]:
    return [(s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        x[:2] == y[:2] and (x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])))
        for x, y in zip(a, b, strict=True))


def test_matches_prometheus_client_on_catalog_expositions():
    for body in job_expositions("llama", 2, 4).values():
        text = body.decode()
        assert _same([tuple(s) for s in parse(text)], _reference(text))
        assert _same([tuple(s) for s in parse(body)], _reference(text))  # bytes as received


def test_wanted_names_keep_only_those_series():
    text = job_expositions("llama", 1, 2)["/train/node-000"].decode()
    got = Parser(WANTED).parse(text)
    assert got and {s.name for s in got} <= WANTED
    assert [tuple(s) for s in got] == [s for s in _reference(text) if s[0] in WANTED]


def test_required_label_text_skips_other_series_of_a_name():
    text = ('cpu{cpu="all",node="a"} 0.5\ncpu{cpu="0",node="a"} 0.1\nmem{node="a"} 3\n'
            'other 1\n')
    got = [(s.name, s.labels, s.value)
           for s in Parser({"cpu", "mem"}, require={"cpu": 'cpu="all"'}).parse(text)]
    assert got == [("cpu", {"cpu": "all", "node": "a"}, 0.5), ("mem", {"node": "a"}, 3.0)]


def test_escapes_braces_timestamps_and_special_values():
    text = (
        '# HELP m help with "quotes"\n# TYPE m gauge\n'
        'm{a="x\\"}y",b="back\\\\slash",c="new\\nline"} 1.5 1700000000000\n'
        "m NaN\nm{a=\"1\"} +Inf\nm{a=\"2\"} -Inf\n"
        'h_bucket{a="1",le="0.5"} 3\n'
    )
    got = parse(text)
    assert got[0].labels == {"a": 'x"}y', "b": "back\\slash", "c": "new\nline"}
    assert got[0].value == 1.5
    assert math.isnan(got[1].value) and got[1].labels == {}
    assert got[2].value == math.inf and got[3].value == -math.inf
    assert got[4].labels == {"a": "1", "le": "0.5"}


def test_malformed_lines_are_skipped_not_fatal():
    text = (
        "good 1\n"
        "no_value\n"
        'unclosed{a="1" 2\n'
        "bad_labels{a=1} 3\n"
        "not_a_number{} abc\n"
        '{a="1"} 4\n'
        "9starts_with_digit 5\n"
        'dup{a="1",,} 6\n'
        "also_good 7\n"
    )
    assert [(s.name, s.value) for s in parse(text)] == [("good", 1.0), ("also_good", 7.0)]


def test_histogram_buckets_reuse_cached_blocks_correctly():
    text = ('h{a="1"} 1\nh{a="1",le="0.5"} 2\nh{le="1",a="1"} 3\nh{le="3"} 4\n'
            'h{a="1",le="4" junk} 5\nh{a="1",le="4",} 6\nh{a="1",le="a\\"b"} 7\n')
    got = [(s.labels, s.value) for s in parse(text)]
    assert got == [({"a": "1"}, 1.0), ({"a": "1", "le": "0.5"}, 2.0),
                   ({"a": "1", "le": "1"}, 3.0), ({"le": "3"}, 4.0),
                   ({"a": "1", "le": "4"}, 6.0), ({"a": "1", "le": 'a"b'}, 7.0)]


def test_parse_labels_rejects_garbage():
    assert parse_labels('a="1", b="2"') == {"a": "1", "b": "2"}
    assert parse_labels('a="1" junk') is None
    assert parse_labels("") == {}


_LINE_PIECES = st.sampled_from([
    "fsdpmon_train_step", "{", "}", '"', "\\", "=", ",", " ", "\t", "\n", "#", "le", "1e3",
    "NaN", "+Inf", "-", "rank", '"0"', "é", "\x00", "\ufffd",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=400), st.lists(_LINE_PIECES, max_size=80).map("".join),
                 st.binary(max_size=400),
                 st.lists(_LINE_PIECES, max_size=80).map(lambda p: "".join(p).encode())))
def test_fuzzed_input_never_raises(text):
    for parser in (Parser(), Parser(WANTED)):
        for sample in parser.parse(text):
            assert isinstance(sample.name, str) and isinstance(sample.value, float)
            assert all(isinstance(k, str) and isinstance(v, str)
                       for k, v in sample.labels.items())
