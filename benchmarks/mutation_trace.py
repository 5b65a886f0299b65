"""A pytest plugin for benchmarks/mutation.py: which test runs which lines of the modules under
mutation (MUTATION_TRACE_FILES, os.pathsep-separated), written as JSON to MUTATION_TRACE_OUT:
{test node id: {file: [line, ...]}}. Lines run outside any test (imports, collection) are
filed under "<outside>". Only frames of those files are traced line by line. A test that
starts a subprocess (which may run the module where no trace sees it) is filed under
"<subprocess>" as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

_FILES = {os.path.realpath(f) for f in os.environ.get("MUTATION_TRACE_FILES", "").split(
    os.pathsep) if f}
_known: dict[str, str | None] = {}  # co_filename -> the traced file it is, or None
_current = ["<outside>"]
_lines: dict[str, dict[str, set[int]]] = {}


def _traced(filename: str) -> str | None:
    found = _known.get(filename, "")
    if found == "":
        real = os.path.realpath(filename)
        found = _known[filename] = real if real in _FILES else None
    return found


def _note(path: str, line: int) -> None:
    _lines.setdefault(_current[0], {}).setdefault(path, set()).add(line)


def _global(frame: Any, event: str, arg: Any) -> Any:
    path = _traced(frame.f_code.co_filename)
    if path is None:
        return None

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            _note(path, frame.f_lineno)
        return local

    _note(path, frame.f_lineno)
    return local


_popen_init = subprocess.Popen.__init__


def _noting_popen(self: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
    _lines.setdefault(_current[0], {}).setdefault("<subprocess>", set()).add(0)
    _popen_init(self, *args, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _noting_popen  # type: ignore[method-assign]
    sys.settrace(_global)
    threading.settrace(_global)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current[0] = item.nodeid
    sys.settrace(_global)  # a test may have set or cleared its own tracer
    yield
    _current[0] = "<outside>"


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]
    sys.settrace(None)
    threading.settrace(None)  # type: ignore[arg-type]
    out = os.environ.get("MUTATION_TRACE_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({test: {path: sorted(lines) for path, lines in files.items()}
                       for test, files in _lines.items()}, f)
