"""The fast parser against the parser test cases of Prometheus's own projects (public test data
in tests/data/expfmt_refs, with its sources): the same samples on every input the references
read, and on the others, those of every line but the one they reject."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fsdpmon.top.expfmt import Parser

CASES = json.loads((Path(__file__).parent / "data/expfmt_refs/cases.json").read_text())["cases"]


def _value(v: float | str) -> float:
    return float(v)  # "nan", "inf" and "-inf" are stored as text (JSON has none)


def _key(sample) -> tuple:
    name, labels, value = sample
    return name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else value


def _expected(case: dict) -> list[tuple]:
    return [_key((n, labels, _value(v))) for n, labels, v in case["expected"]]


def _got(case: dict, names: set[str] | None) -> list[tuple]:
    payload = case["input"].encode("utf-8", "surrogateescape")
    return [_key(s) for s in Parser(names).parse(payload)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['source']}/{c['case']}" for c in CASES])
def test_same_samples_as_the_references(case):
    expected = _expected(case)
    got = _got(case, None)
    assert got == expected, f"{len(got)} samples vs {len(expected)} expected: {case['input']!r}"


@pytest.mark.parametrize("case", [c for c in CASES if c["expected"]],
                         ids=[f"{c['source']}/{c['case']}" for c in CASES if c["expected"]])
def test_same_samples_under_a_name_filter(case):
    """Each name alone, every other name, and all of them: filtered parsing loses nothing."""
    names = sorted({s[0] for s in case["expected"]})
    for wanted in [{n} for n in names] + [set(names[::2]), set(names)]:
        expected = [s for s in _expected(case) if s[0] in wanted]
        got = _got(case, wanted)
        assert got == expected, (f"names {sorted(wanted)}: {len(got)} samples vs "
                                 f"{len(expected)} expected: {case['input']!r}")
