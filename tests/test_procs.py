"""Process discovery and reading against the checked-in fake /proc tree and the real /proc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_tree import kill_tree
from support import rounded

from fsdpmon.exporters.procs import ProcessScanner, command_line, environ_int, parse_stat, redact
from fsdpmon.exporters.sample import PodRef

FIXTURE = Path(__file__).parent / "fixtures" / "proc"
POD_UID = "5b9c2e3f-1d2a-4c6b-9e8f-0a1b2c3d4e5f"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BTIME = 1764480000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A private copy of the fixture tree that a test may change."""
    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root)
    return root


def _set_stat(root: Path, pid: int, **changes: int) -> None:
    path = root / str(pid) / "stat"
    text = path.read_text()
    head, rest = text[: text.rindex(")") + 2], text[text.rindex(")") + 2 :].split()
    index = {"ppid": 1, "utime": 11, "start": 19}
    for key, value in changes.items():
        rest[index[key]] = str(value)
    path.write_text(head + " ".join(rest) + "\n")


def test_parse_stat_handles_parentheses_and_spaces_in_the_command() -> None:
    text = "77 (a) (b c) R 1 77 77 0 -1 0 0 0 0 0 10 5 0 0 20 0 3 0 500 1000 42 0 0\n"
    stat = parse_stat(text)
    assert (stat.comm, stat.state, stat.utime, stat.stime) == ("a) (b c", "R", 10, 5)
    assert (stat.threads, stat.start_ticks, stat.rss_pages) == (3, 500, 42)


def test_secrets_never_reach_the_command_label() -> None:
    raw = (b"python\0-m\0fsdpmon.trainer.train\0--hf-token\0hf_abcdefghijklmnop\0"
           b"--password=hunter2\0")
    text = command_line(raw, "python")
    assert "hf_abcdefghijklmnop" not in text and "hunter2" not in text
    assert text == "python -m fsdpmon.trainer.train --hf-token *** --password=***"
    assert redact("HF_TOKEN=hf_0123456789abcdef run") == "HF_TOKEN=hf_*** run"
    assert command_line(b"", "kthreadd") == "[kthreadd]"
    assert len(command_line(b"x" * 1000, "x")) == 200


def test_outside_kubernetes_training_processes_are_found_by_command_or_environment() -> None:
    scanner = ProcessScanner(str(FIXTURE))
    scanner.scan()
    # 1001: fsdpmon.trainer.train + LOCAL_RANK; 3000: torchrun; 3001: FSDPMON_JOB_NAME in its
    # environ.
    assert sorted(scanner.training_pids()) == [1001, 3000, 3001]


def test_process_values_in_base_units() -> None:
    scanner = ProcessScanner(str(FIXTURE))
    scanner.scan()
    by_pid = {p.pid: p for p in scanner.sample(gpu_pids={1003})}
    assert sorted(by_pid) == [1001, 1003, 3000, 3001]  # the GPU user joins the training ones
    p = by_pid[1001]
    assert p.cpu_seconds == rounded((123456 + 7890) / TICKS)
    assert p.rss_bytes == 512000 * PAGE
    assert p.threads == 48 and p.state == "sleeping" and by_pid[3001].state == "running"
    assert p.start_time_seconds == rounded(BTIME + 200000 / TICKS)
    assert p.command == "/usr/bin/python -u -m fsdpmon.trainer.train --model tiny"
    assert p.user == "root" and p.pod == PodRef()
    assert p.cpu_utilization is None  # needs two samples
    assert "hf_" not in by_pid[3000].command.replace("hf_***", "")


def test_in_kubernetes_training_pods_decide_and_pod_labels_attach() -> None:
    seen: list[tuple[str, str]] = []

    def lookup(pod_uid: str, container_id: str) -> PodRef | None:
        seen.append((pod_uid, container_id))
        if pod_uid == POD_UID:
            name = {"a" * 64: "trainer", "b" * 64: "sidecar"}.get(container_id, "")
            return PodRef("ml", "llama-worker-0", name, training=True)
        return PodRef("web", "nginx-1", "nginx", training=False)

    scanner = ProcessScanner(str(FIXTURE), pod_lookup=lookup)
    scanner.scan()
    # Both containers of the training pod count; a command line alone no longer does.
    assert sorted(scanner.training_pids()) == [1001, 1002]
    by_pid = {p.pid: p for p in scanner.sample(gpu_pids={1003})}
    assert sorted(by_pid) == [1001, 1002, 1003]
    assert by_pid[1001].pod == PodRef("ml", "llama-worker-0", "trainer", True)
    assert by_pid[1002].pod.container == "sidecar"
    assert by_pid[1003].pod.labels() == ("web", "nginx-1", "nginx")
    assert (POD_UID, "a" * 64) in seen


def test_cpu_utilization_from_two_samples(proc: Path) -> None:
    clock = Clock()
    scanner = ProcessScanner(str(proc), clock=clock)
    scanner.scan()
    scanner.sample(())
    clock.now += 2.0
    _set_stat(proc, 1001, utime=123456 + TICKS)  # one CPU second in two wall seconds
    by_pid = {p.pid: p for p in scanner.sample(())}
    assert by_pid[1001].cpu_utilization == rounded(0.5)


def test_vanished_and_reused_pids_are_skipped(proc: Path) -> None:
    scanner = ProcessScanner(str(proc))
    scanner.scan()
    shutil.rmtree(proc / "3000")  # exits between listing and reading
    _set_stat(proc, 1001, start=999999)  # PID 1001 now belongs to another process
    pids = {p.pid for p in scanner.sample(())}
    assert pids == {3001}
    scanner.scan()  # the reused PID is classified afresh
    assert 1001 in scanner.training_pids() and 3000 not in scanner.training_pids()


def test_unreadable_entries_do_not_stop_the_scan(proc: Path) -> None:
    (proc / "1001" / "stat").write_text("garbage without parentheses")
    (proc / "4000").mkdir()  # a PID directory with nothing in it
    scanner = ProcessScanner(str(proc))
    scanner.scan()
    assert sorted(scanner.training_pids()) == [3000, 3001]


def test_cardinality_is_capped() -> None:
    scanner = ProcessScanner(str(FIXTURE), max_processes=2)
    scanner.scan()
    assert [p.pid for p in scanner.sample(gpu_pids={1003})] == [1003, 1001]


def test_real_proc_finds_a_real_training_process() -> None:
    env = {**os.environ, "FSDPMON_JOB_NAME": "test-procs"}
    before = time.time()
    script = "print(flush=True); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                             stdout=subprocess.PIPE)
    try:
        # Scanned between fork and exec, the child still shows this process's environment
        # (the scanner reads it again later: test_a_young_process_is_read_again_...); once it
        # has printed, it runs its own program with its own environment.
        child.stdout.readline()
        scanner = ProcessScanner("/proc")
        scanner.scan()
        assert child.pid in scanner.training_pids()
        (sample,) = [p for p in scanner.sample(()) if p.pid == child.pid]
        assert sample.rss_bytes > 1e6 and sample.threads >= 1
        # ticks since boot (a tick each) added to /proc/stat's btime (whole seconds): within
        # a second and a tick of our reads around the start
        slack = 1 + 1 / os.sysconf("SC_CLK_TCK")
        assert before - slack <= sample.start_time_seconds <= time.time() + slack, (
            before, sample.start_time_seconds)
        assert sample.command.endswith("time.sleep(60)")
    finally:
        kill_tree(child)
        child.stdout.close()


def test_rank_and_local_rank_come_from_the_environment_and_nothing_else_is_kept() -> None:
    env = b"HF_TOKEN=hf_secretsecret\0LOCAL_RANK=3\0RANK=11\0LOCAL_RANK_X=9\0"
    assert environ_int(env, b"LOCAL_RANK") == 3 and environ_int(env, b"RANK") == 11
    assert environ_int(env, b"GROUP_RANK") is None
    assert environ_int(b"RANK=-1\0", b"RANK") is None  # not a rank: not a label
    assert environ_int(b"RANK=1e9\0", b"RANK") is None
    assert environ_int(b"RANK=" + b"9" * 40 + b"\0", b"RANK") is None  # bounded


def test_a_young_process_is_read_again_until_it_has_settled(tmp_path, monkeypatch) -> None:
    """torchrun forks, then execs the worker: a scan between the two sees the launcher's
    command and environment, which must not stick to the worker for RECLASSIFY_S."""
    import fsdpmon.exporters.procs as procs

    root = tmp_path / "proc"
    shutil.copytree(FIXTURE, root, symlinks=True)
    scanner = ProcessScanner(str(root))
    young = root / "3001"
    (young / "environ").write_bytes(b"HOME=/root\0")  # forked from torchrun, not exec'd yet
    (young / "cmdline").write_bytes(b"/usr/bin/python\0/usr/local/bin/torchrun\0")
    start = int((young / "stat").read_text().split(")")[1].split()[19])
    ticks = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(procs.time, "time",
                        lambda: scanner._boot_time + start / ticks + procs.SETTLE_S / 2)
    scanner.scan()
    assert scanner.training_local_ranks()[3001] is None
    (young / "environ").write_bytes(b"LOCAL_RANK=1\0RANK=1\0")  # the exec'd worker
    scanner.scan()
    assert scanner.training_local_ranks()[3001] == 1


def test_simulated_gpus_go_only_to_the_descendants_of_the_given_process(proc: Path) -> None:
    """`fsdpmon demo` hands its exporter its own PID: another job's workers of the same user
    on the machine (3001 here) must not share the demo's simulated GPUs."""
    _set_stat(proc, 1001, ppid=3000)  # a worker of the demo's torchrun ...
    _set_stat(proc, 3000, ppid=2000)  # ... which the demo (2000 here) started
    scanner = ProcessScanner(str(proc))
    scanner.scan()
    assert scanner.training_local_ranks() == {1001: 0, 3000: None, 3001: 1}
    scanner.holders_under = 2000
    assert scanner.training_local_ranks() == {1001: 0, 3000: None}
    scanner.holders_under = 4242  # no such ancestor: nobody holds them
    assert scanner.training_local_ranks() == {}
