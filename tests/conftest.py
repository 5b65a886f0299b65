"""How the suite's two workers (scripts/test.sh: pytest-xdist, whole files per worker) share the
machine's cores.

Most end-to-end tests run real jobs that keep every core busy while they wait on real clocks.
Two of them side by side still pass; but the tests marked ``alone`` judge time itself (a stall
booked as its seconds, a hang named within its bound, a starved rank named within a window)
and a second job beside them adds its load to what they measure. So, across the workers of one
run, an ``alone`` test holds an exclusive lock, a ``slow`` test a shared one, and the rest none:
an ``alone`` test runs beside unit tests only, and beside ``quiet`` ones (slow, but their
processes mostly wait). The lock is taken before pytest-timeout's timer starts (the outermost
hook), so waiting for it never counts against a test's timeout. Outside xdist (one process)
nothing is locked.

The ``alone`` files go to one worker as one unit of work (the scheduler below, for
scripts/test.sh's ``--dist loadfile``: every other file is a unit of its own), first:
they run back to back while the other worker takes the unit-test and quiet files, which come
next in the order collected (scripts/test.sh turns off xdist's reordering by test count), and
then the ``slow`` files, which both workers share once the ``alone`` ones are done. Handed out
one file at a time instead, an ``alone`` file's neighbour would take the next ``alone`` one and
wait for the lock with nothing to run (63 s of a worker's time in a run at c252d4b).

The ``slow`` files go longest first (LONGEST_FIRST), so that the run ends on short files and
the two workers finish close together: in collection order a 90 s file came last and one worker
ran alone for its last 23 s (a run at e9d0303).
"""

from __future__ import annotations

import ast
import fcntl
import functools
import os
from pathlib import Path

import pytest

_held: dict[str, object] = {"kind": None, "fd": None}
# The longest ``slow`` files, longest first, as two full runs at e9d0303 timed them (60-93 s
# down to 20 s); the other ``slow`` files follow in collection order. A scheduling hint only:
# a file missing from it runs all the same.
LONGEST_FIRST = ("test_integrations.py", "test_e2e_straggler.py", "test_e2e_report.py",
                 "test_e2e_demo.py", "test_e2e_victoria.py", "test_e2e_training.py",
                 "test_exit_record.py", "test_e2e_monitor.py", "test_manifests_e2e.py",
                 "test_outside_faults.py", "test_spike_e2e.py", "test_doors_agree.py",
                 "test_shutdown.py", "test_desync_e2e.py", "test_e2e_top.py")


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
    slow.sort(key=_longest_first)
    items[:] = [t for tests in (*alone, *light, *slow) for t in tests]


def _longest_first(tests: list[pytest.Item]) -> int:
    name = tests[0].path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def _uses_mark(path: Path, name: str) -> bool:
    """Whether a test file uses ``pytest.mark.<name>`` anywhere. xdist's controller collects
    nothing, so it reads the file (its workers read the markers): the same marker, read twice."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False  # not ours to judge: the workers report it
    return any(isinstance(node, ast.Attribute) and node.attr == name
               and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
               for node in ast.walk(tree))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``: whole files as units, except that the ``alone`` files are one."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    alone = functools.cache(lambda file: _uses_mark(config.rootpath / file, "alone"))

    class FilesAloneTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return "alone files" if alone(file) else file

    return FilesAloneTogether(config, log)


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
