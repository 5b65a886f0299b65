"""How the suite's two workers (scripts/test.sh: pytest-xdist, whole files per worker) share the
machine's cores.

Most end-to-end tests run real jobs that keep every core busy while they wait on real clocks.
Two of them side by side still pass; but the tests marked ``alone`` judge time itself (a stall
booked as its seconds, a hang named within its bound, a starved rank named within a window)
and a second job beside them adds its load to what they measure. So, across the workers of one
run, an ``alone`` test holds an exclusive lock, a ``slow`` test a shared one, and the rest none:
an ``alone`` test runs beside unit tests only, and beside ``quiet`` ones (slow, but their
processes mostly wait: under half a core, less than a unit test loads). The lock is taken
before pytest-timeout's timer starts (the outermost hook), so waiting for it never counts
against a test's timeout. Outside xdist (one process) nothing is locked.

The files are handed to the workers in the order collected (scripts/test.sh turns off xdist's
reordering by test count, which put the longest one-test file last, alone at the tail). The
order: each ``alone`` file followed by a share of the unit-test and quiet files, which the
other worker runs beside it, then the ``slow`` files, two at a time.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

_held: dict[str, object] = {"kind": None, "fd": None}


def _kind(item: pytest.Item) -> int | None:
    if item.get_closest_marker("alone") is not None:
        return fcntl.LOCK_EX
    if item.get_closest_marker("slow") is not None and item.get_closest_marker("quiet") is None:
        return fcntl.LOCK_SH
    return None  # a unit test, or a quiet one: it loads a core less than a unit test does


def _lock_file(config: pytest.Config) -> Path | None:
    if getattr(config, "workerinput", None) is None:  # set in xdist's workers only
        return None
    # xdist gives each worker the run's base temp directory plus its own name (…/popen-gw0):
    # the parent is the run's, shared by its workers and pruned with it by pytest.
    return Path(config.option.basetemp).parent / "workers.lock"


def _release() -> None:
    fd = _held["fd"]
    if fd is not None:
        os.close(fd)  # type: ignore[arg-type]  # closing drops the flock
    _held.update(kind=None, fd=None)


def _acquire(path: Path, kind: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, kind)
    _held.update(kind=kind, fd=fd)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    files: dict[object, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    alone, slow, light = [], [], []
    for tests in files.values():
        kinds = {_kind(t) for t in tests}
        (alone if fcntl.LOCK_EX in kinds else slow if fcntl.LOCK_SH in kinds else light).append(
            tests)
    order = []
    share = -(-len(light) // max(1, len(alone)))  # ceil: every light file placed
    for n, tests in enumerate(alone):
        order += [tests, *light[n * share:(n + 1) * share]]
    order += light[len(alone) * share:] + slow
    items[:] = [t for tests in order for t in tests]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    path = _lock_file(item.config)
    kind = _kind(item) if path is not None else None
    if kind != _held["kind"]:
        _release()
        if kind is not None:
            _acquire(path, kind)  # type: ignore[arg-type]
    yield
    if nextitem is None:  # the worker's last item for now (its teardown is done)
        _release()
