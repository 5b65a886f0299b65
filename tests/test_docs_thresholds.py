"""docs/diagnose.md's table of thresholds against fsdpmon/conventions.py (issue 48): each value
as defined, and every threshold the judge or a door imports listed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fsdpmon import conventions

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "diagnose.md"
ROW = re.compile(r"^\| `([A-Z_0-9]+)` \| ([^|]+) \|", re.MULTILINE)
# Where verdicts are reached: the judge and the doors that present its findings.
VERDICTS = ("fsdpmon/diagnose", "fsdpmon/incidents", "fsdpmon/job", "fsdpmon/scrape/rows.py")


def shown(value: object) -> str:
    """A value as the table writes it: 0.75, 10, 2; a tuple as its items."""
    if isinstance(value, tuple):
        return ", ".join(shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def is_threshold(value: object) -> bool:
    """A number (or a tuple of them): not a name, a label or a function."""
    if isinstance(value, tuple):
        return bool(value) and all(is_threshold(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table(text: str) -> dict[str, str]:
    section = text.split("## Thresholds", 1)[1].split("\n## ", 1)[0]
    return {name: value.strip() for name, value in ROW.findall(section)}


def drift(rows: dict[str, str]) -> dict[str, tuple[str, str]]:
    """name -> (the table's value, the defined one) where they differ (or nothing is defined)."""
    return {name: (value, shown(getattr(conventions, name, None)))
            for name, value in rows.items()
            if not hasattr(conventions, name) or value != shown(getattr(conventions, name))}


def imported_thresholds() -> set[str]:
    files: list[Path] = []
    for where in VERDICTS:
        path = REPO / where
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "fsdpmon.conventions":
                names |= {a.name for a in node.names}
    return {n for n in names if is_threshold(getattr(conventions, n))}


def test_each_value_in_the_table_is_the_one_defined():
    rows = table(DOC.read_text())
    assert rows, "no thresholds table in docs/diagnose.md"
    wrong = drift(rows)
    assert not wrong, f"docs/diagnose.md says, conventions.py defines: {wrong}"


def test_every_threshold_a_verdict_uses_is_in_the_table():
    missing = imported_thresholds() - set(table(DOC.read_text()))
    assert not missing, f"thresholds used by a verdict but not in docs/diagnose.md: {missing}"


@pytest.mark.parametrize(("doc", "fails"), [
    ("## Thresholds\n\n| `CHECKPOINT_SHARE_LIMIT` | 0.25 | x |\n", False),
    ("## Thresholds\n\n| `CHECKPOINT_SHARE_LIMIT` | 0.3 | x |\n", True),
    ("## Thresholds\n\n| `NOT_A_CONVENTION` | 1 | x |\n", True),
])
def test_a_value_that_drifts_fails(doc, fails):
    assert bool(drift(table(doc))) == fails, doc


def test_values_are_written_as_the_table_writes_them():
    assert [shown(v) for v in (0.75, 10.0, 2, (48, 63))] == ["0.75", "10", "2", "48, 63"]
    assert not is_threshold("killed") and not is_threshold(True) and is_threshold((1, 2))
