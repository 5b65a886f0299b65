"""tests/conftest.py's schedule: the files it names exist and are what it takes them for."""

from __future__ import annotations

from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_longest_first_names_slow_files_that_exist_and_are_not_alone():
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)
    for name in conftest.LONGEST_FIRST:
        path = TESTS / name
        assert path.is_file(), f"{name} is gone: drop it from LONGEST_FIRST"
        assert conftest._uses_mark(path, "slow"), f"{name} is not marked slow"
        assert not conftest._uses_mark(path, "alone"), f"{name} runs alone, not with the slow files"


def test_uses_mark_sees_the_marker_only_as_a_marker(tmp_path):
    marked = tmp_path / "test_a.py"
    marked.write_text("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.alone]\n")
    said = tmp_path / "test_b.py"
    said.write_text('"""pytest.mark.alone in a docstring."""\nalone = 1\n')
    broken = tmp_path / "test_c.py"
    broken.write_text("def (:\n")
    assert [conftest._uses_mark(p, "alone") for p in (marked, said, broken)] == [
        True, False, False]
    assert conftest._uses_mark(marked, "slow") and not conftest._uses_mark(marked, "quiet")


def test_slow_files_sort_by_their_place_and_the_rest_after():
    class Item:
        def __init__(self, name: str) -> None:
            self.path = TESTS / name

    first, second = conftest.LONGEST_FIRST[:2]
    files = [[Item("test_zz_unlisted.py")], [Item(second)], [Item(first)]]
    files.sort(key=conftest._longest_first)
    assert [f[0].path.name for f in files] == [first, second, "test_zz_unlisted.py"]
