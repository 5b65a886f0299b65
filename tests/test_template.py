"""The C half of the layouts (fsdpmon/scrape/_lines.c): a body it takes as its template's but for
the values is one the regex scan reads as the template's series with those values, on every line
of the Prometheus projects' parser cases and of a job's bodies, each line's last token replaced
by numbers, words and the characters the scan treats apart."""

from __future__ import annotations

import importlib
import math
import random
import re
import shutil
import struct
import sysconfig
from array import array
from pathlib import Path

import pytest
from synthetic_job import job_expositions
from test_expfmt_refs import CASES

from fsdpmon.scrape import fastpath, layout
from fsdpmon.scrape.expfmt import Parser, terminated
from fsdpmon.scrape.wanted import REQUIRE, WANTED

fill = fastpath.built().fill  # the C half itself, whatever FSDPMON_PURE_PYTHON says
needs_c = pytest.mark.skipif(fill is None, reason="fsdpmon.scrape._lines is not built")

# New last tokens: numbers as Go and Python write them, words, and what the scan reads apart
# (a brace, an underscore, a quote, a blank, a comment sign, a name, a token past 63 bytes).
TOKENS = [b"7", b"-1.5e+3", b"0", b"NaN", b"+Inf", b"-Inf", b"abc", b"1_0", b"0x10", b"{",
          b"}", b"_", b'a"b', b"", b"1 2", b"#", b"fsdpmon_train_step", b"9" * 70, b"1e999",
          b"\r", b"up", b"foo"]

# Bodies of lines the scan reads apart: a lone token (with blanks around it), a name top may
# want after blanks, a label value holding '}' and blanks, a required name with and without its
# text, a comment whose last word is a name.
CRAFTED = [
    b'x\n  x\nx  \nfoo 1\nfoo{a="} 2"} 3\nbar{type="x"} 4\nbar{type="y"} 5\n# HELP foo\n',
    b'foo 1\n \t \nup 2\t \nfoo{a="1"}\t6\n# TYPE foo gauge\nbar 7\n',
]


def _lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\n")[1:-1]


def _with_token(line: bytes, token: bytes) -> bytes:
    """The line with its last token (after the last blank run, before trailing blanks) made
    ``token``."""
    text = line.rstrip(b" \t")
    start = max(text.rfind(b" "), text.rfind(b"\t")) + 1
    return text[:start] + token + line[len(text):]


def _check(pattern, data: bytes, mutated: list[bytes]) -> tuple[int, list[str]]:
    """Each body of ``mutated`` against ``data`` as its template: (how many fill took, what
    went wrong)."""
    old = pattern.findall(data)
    slots = layout.template_slots(data, pattern, range(len(old)))
    if slots is None:
        return 0, []
    taken, wrong = 0, []
    for new in mutated:
        values = fill(data, new, slots, len(old))
        if values is None:
            continue
        taken += 1
        scanned = pattern.findall(new)
        if [(s, odd) for s, _v, odd in scanned] != [(s, odd) for s, _v, odd in old]:
            wrong.append(f"series differ: {scanned} vs {old} on {new!r}")
            continue
        for (_s, raw, _odd), value in zip(scanned, values, strict=True):
            expected = float(raw)
            if not (value == expected or (math.isnan(value) and math.isnan(expected))):
                wrong.append(f"value {value!r} for {raw!r} (float: {expected!r}) on {new!r}")
    return taken, wrong


def _mutations(data: bytes) -> list[bytes]:
    lines = _lines_of(data)
    out = []
    for i, line in enumerate(lines):
        for token in TOKENS:
            changed = [*lines[:i], _with_token(line, token), *lines[i + 1:]]
            out.append(b"\n" + b"".join(x + b"\n" for x in changed))
    return out


@needs_c
def test_what_fill_takes_the_scan_reads_alike_on_the_reference_cases():
    taken, wrong, patterns = 0, [], 0
    for case in CASES:
        data = terminated(case["input"].encode("utf-8", "surrogateescape"))
        names = sorted({s[0] for s in case["expected"]})
        require = {names[0]: 'type="x"'} if names else {}
        for parser in (Parser(None), Parser(names), Parser(names, require)):
            got, bad = _check(parser._line, data, _mutations(data))
            taken, patterns = taken + got, patterns + 1
            wrong += [f"{case['source']}/{case['case']}: {w}" for w in bad]
    assert not wrong, f"{len(wrong)} bodies fill took differ from the scan:\n" + \
        "\n".join(wrong[:20])
    assert taken > 1000, f"fill took only {taken} mutated bodies over {patterns} patterns"


@needs_c
def test_what_fill_takes_the_scan_reads_alike_on_lines_read_apart():
    taken, wrong = 0, []
    for body in CRAFTED:
        data = terminated(body)
        for parser in (Parser(None), Parser(["foo", "up"]), Parser(["foo", "bar", "up"],
                                                                   {"bar": 'type="x"'})):
            got, bad = _check(parser._line, data, _mutations(data))
            taken, wrong = taken + got, wrong + bad
    assert not wrong, f"{len(wrong)} differ:\n" + "\n".join(wrong[:20])
    assert taken > 50, f"fill took only {taken} mutated bodies"


@needs_c
def test_what_fill_takes_the_scan_reads_alike_on_a_jobs_bodies():
    """Top's own scan (its names, the required texts) on a training pod's and an exporter's
    bodies; new numbers on every line but the comments are all taken."""
    pattern = Parser(WANTED, REQUIRE)._line
    bodies = job_expositions("llama2-7b", 2, 2)
    taken, wrong = 0, []
    for path in sorted(bodies)[:2] + sorted(bodies)[-2:]:
        data = terminated(bodies[path])
        got, bad = _check(pattern, data, _mutations(data))
        taken, wrong = taken + got, wrong + [f"{path}: {w}" for w in bad]
        numbers = [b"\n" + b"".join((x if x.startswith(b"#") else _with_token(x, b"42.5"))
                                      + b"\n" for x in _lines_of(data))]
        assert _check(pattern, data, numbers)[0] == 1, f"{path}: new numbers not taken"
    assert not wrong, f"{len(wrong)} differ:\n" + "\n".join(wrong[:20])
    assert taken > 100, f"fill took only {taken} mutated bodies"


@needs_c
def test_fill_refuses_what_does_not_fit_the_template():
    data = b"\na 1\nb{x=\"1\"} 2\n"
    slots = layout.template_slots(data, Parser(None)._line, [1, 0])
    assert fill(data, data, slots, 2) == [2.0, 1.0]
    assert fill(data, b"\na 3\nb{x=\"1\"} 4\n", slots, 2) == [4.0, 3.0]
    blanks = b"\na\t1 \t\n"  # blanks before and after the value
    one = layout.template_slots(blanks, Parser(None)._line, [0])
    assert fill(blanks, b"\na\t-2e3 \t\n", one, 1) == [-2000.0]
    for new in (b"\na 3\nb{x=\"2\"} 4\n", b"\na 3\n", b"\na 3\nb{x=\"1\"} 4\nc 5\n",
                b"a 3\nb{x=\"1\"} 4\n", b"\na 3\nb{x=\"1\"} 4", b"\na  3\nb{x=\"1\"} 4\n",
                b"\na 3 \nb{x=\"1\"} 4\n", b"\na 0x3\nb{x=\"1\"} 4\n", b""):
        assert fill(data, new, slots, 2) is None, f"took {new!r}"
    for count in (1, 3):  # the slots name other values than asked for
        assert fill(data, data, slots, count) is None, f"count {count} taken"
    assert fill(data, data, slots[:4], 2) is None, "slots for fewer lines taken"
    assert fill(data, data, slots + slots[:4], 2) is None, "slots for more lines taken"
    for bad in ((None, data, slots, 2), (data, data, slots, -1), (data, data, slots)):
        with pytest.raises((TypeError, ValueError)):
            fill(*bad)


def _decimals(count: int) -> list[bytes]:
    """Decimals as exporters write them and past what fill reads without strtod: up to 19
    digits around the point (the mantissa passes 2^53 from 16), exponents past +-22, signed
    zeros, and tokens float() refuses."""
    rnd = random.Random(20261204)

    def digits(most: int) -> str:
        return "".join(rnd.choice("0123456789") for _ in range(rnd.randint(0, most)))

    out = [b"0", b"-0", b"+0", b"-0.0", b"5.", b".5", b"+.5", b"-.5e1", b".", b"e5", b"1e",
           b"1e+", b"-", b"9007199254740992", b"9007199254740993", b"9007199254740992.5",
           b"1e22", b"1e23", b"1e-22", b"1e-23", b"4e+10", b"0.41000000000000003",
           b"1.7976931348623157e308", b"5e-324", b"1e-400", b"1" * 30, b"0." + b"0" * 30 + b"1"]
    while len(out) < count:
        text = rnd.choice(["", "", "-", "+"]) + digits(19)
        if rnd.random() < 0.6:
            text += "." + digits(19)
        if rnd.random() < 0.4:
            text += rnd.choice("eE") + rnd.choice(["", "+", "-"]) + digits(3)
        out.append(text.encode())
    return out


@needs_c
def test_fill_reads_a_decimal_as_float_does_to_the_bit():
    """fill reads plain decimals whose value is exact in one multiplication or division
    without PyOS_string_to_double (_lines.read_decimal); every value is float()'s, to the bit
    (the sign of a zero too), and what float() refuses is refused."""
    slots, wrong, read = array("i", [0]).tobytes(), [], 0
    for token in _decimals(20000):
        got = fill(b"\nm 1\n", b"\nm " + token + b"\n", slots, 1)
        try:
            want: float | None = float(token)
        except ValueError:
            want = None
        if got is None or want is None:
            if (got is None) != (want is None):
                wrong.append(f"{token!r}: fill {got!r}, float {want!r}")
            continue
        read += 1
        if struct.pack("<d", got[0]) != struct.pack("<d", want):
            wrong.append(f"{token!r}: fill {got[0]!r}, float {want!r}")
    assert not wrong, f"{len(wrong)} of 20000 differ:\n" + "\n".join(wrong[:20])
    assert read > 15000, f"only {read} of 20000 read"


def test_a_timestamped_value_has_no_template():
    data = b"\na 1 1700000000\n"
    assert layout.template_slots(data, Parser(None)._line, [0]) is None


def test_the_c_halves_are_built_where_a_compiler_is():
    """setup.sh builds every fsdpmon/scrape/_*.c (optional extensions: without a compiler or
    Python's headers, top scans and files in Python instead), so the skips of the tests that
    need one cannot hide a broken build."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(compiler) is None or not headers.exists():
        pytest.skip(f"no C compiler ({compiler}) or no {headers}")
    sources = sorted(Path(layout.__file__).parent.glob("_*.c"))
    assert len(sources) >= 3, f"C halves found: {sources}"
    missing = []
    for source in sources:
        try:
            importlib.import_module(f"fsdpmon.scrape.{source.stem}")
        except ImportError as exc:
            missing.append(f"{source.stem} ({exc})")
    assert not missing, f"not built though {compiler} and {headers} are here: {missing}"


def test_each_c_half_is_a_module_of_its_own_with_the_headers_it_includes():
    """pyproject.toml builds each fsdpmon/scrape/_*.c as the module of its name, and lists in its
    depends every _*.h that source includes: what sdist ships and what makes build_ext and
    setup.sh's stamp rebuild it when only the header changed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(layout.__file__).parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = setuptools["ext-modules"]
    declared = {m["name"]: m for m in modules}
    here = Path(layout.__file__).parent
    for source in sorted(here.glob("_*.c")):
        module = declared.get(f"fsdpmon.scrape.{source.stem}")
        assert module is not None, f"{source.name} is built by no ext-module: {sorted(declared)}"
        assert module["sources"] == [f"fsdpmon/scrape/{source.name}"], f"{source.name}: {module}"
        included = set(re.findall(r'#include "(_\w+\.h)"', source.read_text()))
        depends = {Path(d).name for d in module.get("depends", [])}
        assert included == depends, (
            f"{source.name} includes {sorted(included)}; its depends: {sorted(depends)}"
        )
    headers = {h.name for h in here.glob("_*.h")}
    listed = {Path(d).name for m in modules for d in m.get("depends", [])}
    assert headers == listed, f"headers {sorted(headers)} against depends {sorted(listed)}"


def test_a_line_dropped_with_a_timestamp_leaves_no_template():
    """A matched line whose value is not its last token makes no template even when its value
    is not picked (``order`` leaves it out): its new last token could make it read otherwise."""
    data = b"\na 1\nb 2 1700000000\n"
    pattern = Parser(None)._line
    assert layout.template_slots(data, pattern, [0]) is None
    assert layout.template_slots(b"\na 1\nb 2\n", pattern, [0]) is not None


@needs_c
@pytest.mark.parametrize("digit", ["١", "１", "१"])
def test_fill_refuses_digits_of_other_scripts(digit):
    """A value written in another script's digits is no number to Prometheus (Go's ParseFloat
    reads ASCII only): fill leaves such a body to the line-by-line reading, which drops it."""
    slots = array("i", [0]).tobytes()
    for token in (digit, f"1{digit}", f"{digit}.5", f"1e{digit}"):
        assert fill(b"\nm 1\n", f"\nm {token}\n".encode(), slots, 1) is None, token
