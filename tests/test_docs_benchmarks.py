"""Every file in benchmarks/ is listed in docs/benchmarks.md, and the page lists none that is gone.

A benchmark earns its place by the figures a doc page quotes from it; the page is where a reader
finds each one's command and its last figures, so a script it does not name is dead weight (or
undocumented), and a name it keeps after the script went is a stale promise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
# A benchmark's file name as the page writes it: in backticks, bare or under benchmarks/.
NAMED = re.compile(r"`(?:benchmarks/)?([\w.-]+\.(?:py|toml))`")


def scripts() -> list[str]:
    return sorted(p.name for p in (ROOT / "benchmarks").iterdir()
                  if p.is_file() and p.suffix in (".py", ".toml"))


def named(text: str) -> set[str]:
    return set(NAMED.findall(text))


def test_the_benchmarks_are_found():
    assert "bench_monitor.py" in scripts() and "mutation.py" in scripts(), scripts()


@pytest.mark.parametrize("name", scripts())
def test_every_benchmark_is_listed_in_the_page(name):
    assert name in named(PAGE.read_text()), (
        f"benchmarks/{name} is not named in docs/benchmarks.md: list it (command, what it "
        f"measures, its last figures), or delete it if no page quotes its figures")


def test_the_page_names_no_benchmark_that_is_gone():
    page = PAGE.read_text()
    gone = sorted(n for n in named(page) if n.startswith(("bench_", "top_"))
                  and not (ROOT / "benchmarks" / n).is_file())
    assert not gone, f"docs/benchmarks.md names benchmarks that do not exist: {gone}"


@pytest.mark.parametrize("text, expected", [
    ("## `bench_x.py`\nsee `benchmarks/helper.py` and `rules.toml`", {"bench_x.py", "helper.py",
                                                                      "rules.toml"}),
    ("bench_x.py in plain text, `bench_y.sh`, `fsdpmon top`", set()),
])
def test_names_are_read_only_from_code_spans(text, expected):
    assert named(text) == expected
