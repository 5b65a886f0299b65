"""The fast parser against the parser test cases of Prometheus's own projects (public test data
in tests/data/expfmt_refs, with its sources): the same samples on every input the references
read, and on the others, those of every line but the one they reject."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fsdpmon.scrape.expfmt import Parser

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


def _name(case: dict) -> str:
    return f"{case['source']}/{case['case']}"


def test_same_samples_as_the_references():
    wrong = []
    for case in CASES:
        expected, got = _expected(case), _got(case, None)
        if got != expected:
            wrong.append(f"{_name(case)}: {len(got)} samples vs {len(expected)}: {got} vs "
                         f"{expected} on {case['input']!r}")
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases differ:\n" + "\n".join(wrong)


def test_same_samples_under_a_name_filter():
    """Each name alone, every other name, and all of them: filtered parsing loses nothing."""
    wrong = []
    for case in CASES:
        names = sorted({s[0] for s in case["expected"]})
        for wanted in [{n} for n in names] + [set(names[::2]), set(names)]:
            expected = [s for s in _expected(case) if s[0] in wanted]
            got = _got(case, wanted)
            if got != expected:
                wrong.append(f"{_name(case)} names {sorted(wanted)}: {len(got)} samples vs "
                             f"{len(expected)}: {got} vs {expected}")
    assert not wrong, f"{len(wrong)} filtered parses differ:\n" + "\n".join(wrong)


def test_the_cases_cover_both_kinds():
    """The data holds what the references read and what they reject (a guard on extract.py)."""
    sources = {c["source"] for c in CASES}
    rejected = sum(1 for c in CASES if not c["parses"])
    assert sources == {"client_python", "common", "openmetrics"}, sources
    assert 0 < rejected < len(CASES), f"{rejected} rejected of {len(CASES)}"
