"""Benchmark the blind spots (issue 40) on real CPU jobs: how long each fault takes to be named,
on which rank, at 2 and 4 ranks. Prints; asserts nothing.

Each fault runs on a fresh job (tests/diagnose_job.py: torchrun CPU ranks of the tiny trainer,
started through tests/trainer_outside_faults.py) watched as `fsdpmon diagnose` watches it (the
engine on the pod endpoint's snapshots every ~0.5 s). Made from outside the trainer's injector
unless said:
  cpu-neighbours   rank 1's threads pinned to core 1 with two busy loops pinned there (taskset)
                   -> host_cpu_contention on rank 1. (At 4 ranks on a 2-core host the other
                   ranks share what is left, and one of them may land on the loaded core too:
                   keeping them off it instead puts three ranks on one core, as starved as
                   rank 1; neither is one starved rank among healthier ones: cpu-apart is.)
  cpu-apart        the other ranks pinned to core 0, rank 1 to core 1 with 2 x (ranks - 1) busy
                   loops there: rank 1 gets 1/(2 x ranks - 1) of a core, each other rank
                   1/(ranks - 1) -> host_cpu_contention on rank 1 (at 4 ranks: 1/7 vs 1/3)
  cpu-quota        rank 1 moved into a cgroup with a 25% CPU quota (v2 cpu.max, or v1's cpu
                   controller) -> cpu_throttled on rank 1
  stop-port-holder SIGSTOP of local rank 0, which started the pod's server -> rank_unresponsive
                   on rank 0, every other rank still served
  gil-hang         rank 1 hangs in a C call holding the GIL (injector: hang where=gil, a
                   ctypes.PyDLL call) -> rank_unresponsive on rank 1
  nan-logits       rank 1's logits NaN at step S (a patched model) -> loss_nonfinite on rank 1
                   at step S (the others follow through the gradient reduce)
  desync           rank 1 makes one extra all_reduce in step S (tests/desync_trainer.py, a
                   patched step) -> collective_desync on rank 1 (at 4 ranks, the minority);
                   timed from when step S - 1, the last the job completes, is served
  loss-spike       after 15 s of ordinary steps, rank 1's logits x 1000 (tests/spike_trainer.py,
                   a patched model) -> loss_spike on rank 1, the rank it began on
  healthy-loose    two busy loops the scheduler places freely, for HEALTHY_S: names nothing
  healthy-alike    every rank pinned to one core, for HEALTHY_S: each as starved as the
                   others, names nothing
  healthy-apart    cpu-apart's pinning without its loops (rank 1 alone on core 1), for
                   HEALTHY_S: names nothing
  kill-all         SIGKILL of every rank -> the pod's server ends by itself: seconds until it
                   is gone, the port free, what the state directory keeps
Printed per fault: the finding, the seconds from the fault starting to the first refresh naming
it, and any refresh that named another rank for the same cause ("wrong"). Then the machine and
its load average. Run: ``.venv/bin/python benchmarks/bench_blind.py [--ranks 2 4] [--only ...]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from cpu_starve import (  # noqa: E402
    QuotaUnavailable,
    cpu_quota,
    loose_loops,
    neighbours,
    pinned_alike,
)
from desync_trainer import DESYNC  # noqa: E402
from diagnose_job import REPO, Job, faulty_job, named, stepping, workers  # noqa: E402
from spike_trainer import SPIKE  # noqa: E402
from trainer_outside_faults import NAN_LOGITS  # noqa: E402

from fsdpmon.monitor import podserver  # noqa: E402
from fsdpmon.monitor.heartbeat import pid_alive  # noqa: E402

S = 60  # step faults start at: after the job has settled
DEADLINE_S = 150.0
HEALTHY_S = 60.0
ENTRY = (str(REPO / "tests" / "trainer_outside_faults.py"),)
Fault = Callable[[Job, dict[int, int]], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# The loss spike's trigger: while it exists rank 1 scales its logits by the number it holds.
SPIKE_TRIGGER = Path(tempfile.gettempdir()) / f"fsdpmon-bench-spike-{os.getpid()}"
SPIKE_SCALE, SPIKE_CALM_S = 1000.0, 15.0  # as tests/test_spike_e2e.py; a recent level first


@contextlib.contextmanager
def _spike() -> Iterator[None]:
    """After SPIKE_CALM_S of ordinary steps (the level the spike is judged against, watched
    and recorded), rank 1's logits x SPIKE_SCALE until the fault's watch ends; the fault
    begins when the trigger is there (STARTS)."""
    timer = threading.Timer(SPIKE_CALM_S, SPIKE_TRIGGER.write_text, (str(SPIKE_SCALE),))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        SPIKE_TRIGGER.unlink(missing_ok=True)
        SPIKE_TRIGGER.with_suffix(".step").unlink(missing_ok=True)


@contextlib.contextmanager
def _neighbours_apart(pids: dict[int, int], loops: int) -> Iterator[None]:
    """Rank 1 and ``loops`` busy loops pinned to core 1, every other rank to core 0: the other
    ranks keep a core of their own, rank 1 gets 1/(loops + 1) of one."""
    others = [pid for rank, pid in pids.items() if rank != 1]
    with pinned_alike(others, core=0), neighbours(pids[1], core=1, count=loops):
        yield


# name -> (cause, rank, how it is made: None for a fault at step S through the job's env/spec)
FAULTS: dict[str, tuple[str, int, Fault | None]] = {
    "cpu-neighbours": ("host_cpu_contention", 1, lambda job, p: neighbours(p[1], core=1)),
    "cpu-apart": ("host_cpu_contention", 1,
                  lambda job, p: _neighbours_apart(p, loops=2 * (len(p) - 1))),
    "cpu-quota": ("cpu_throttled", 1, lambda job, p: cpu_quota(p[1], 25)),
    "stop-port-holder": ("rank_unresponsive", 0, lambda job, p: _stopped(p[0])),
    "gil-hang": ("rank_unresponsive", 1, None),
    "nan-logits": ("loss_nonfinite", 1, None),
    "desync": ("collective_desync", 1, None),
    "loss-spike": ("loss_spike", 1, lambda job, p: _spike()),
}
SPECS = {"gil-hang": f"hang:rank=1,at_step={S},where=gil"}
ENVS = {"nan-logits": {NAN_LOGITS: f"rank=1,step={S}"}, "desync": {DESYNC: f"rank=1,step={S}"},
        "loss-spike": {SPIKE: f"rank=1,trigger={SPIKE_TRIGGER}"}}
ENTRIES = {"desync": (str(REPO / "tests" / "desync_trainer.py"),),
           "loss-spike": (str(REPO / "tests" / "spike_trainer.py"),)}
BEGINS = {"desync": S - 1}  # the step served when the fault has begun (a desync hangs step S)
# An outside fault that begins later than it is set up: when it has begun.
STARTS: dict[str, Callable[[], bool]] = {"loss-spike": SPIKE_TRIGGER.exists}
# Trainer flags: a rank's own loss each step, so the rank a spike began on is told apart.
EXTRA = {"loss-spike": ("--log-every", "1")}


def run_fault(name: str, ranks: int) -> str:
    cause, rank, make = FAULTS[name]
    with tempfile.TemporaryDirectory() as tmp, faulty_job(
            Path(tmp), ranks, SPECS.get(name, ""), EXTRA.get(name, ()),
            entry=ENTRIES.get(name, ENTRY),
            env_extra=ENVS.get(name)) as job:
        job.wait("stepping", stepping(ranks), 300)
        pids = workers(job)
        with contextlib.ExitStack() as stack:
            if make is not None:
                try:
                    stack.enter_context(make(job, pids))
                except QuotaUnavailable as why:
                    return f"{name:<17} skipped: {why}"
                fault_at: float | None = None if name in STARTS else time.monotonic()
            else:
                fault_at = None
            return _watch(job, name, cause, rank, fault_at)


def _watch(job: Job, name: str, cause: str, rank: int, fault_at: float | None) -> str:
    wrong: set[str] = set()
    deadline = time.monotonic() + DEADLINE_S + 300
    said: list[str] = []
    while time.monotonic() < deadline:
        snap, verdict = job.refresh()
        now = time.monotonic()
        if fault_at is None and (STARTS[name]() if name in STARTS else any(
                (r.step or 0) >= BEGINS.get(name, S) for r in snap.ranks)):
            fault_at = now  # the step fault's step is served (or its start seen): it has begun
            deadline = now + DEADLINE_S
        wrong |= {f"{f.cause}(rank {f.rank})" for f in verdict.findings
                  if f.cause == cause and f.rank != rank}
        hit = named(verdict.findings, cause, rank)
        if fault_at is not None and hit:
            served = sorted(r.rank for r in snap.ranks if not r.down)
            extra = f"; step: {hit.summary}" if cause == "loss_nonfinite" else ""
            return (f"{name:<17} {hit.cause:<20} rank {hit.rank}  {now - fault_at:5.1f}s  "
                    f"served ranks {served}  wrong: {', '.join(sorted(wrong)) or 'none'}{extra}")
        said = [f"{f.cause}(rank {f.rank})" for f in verdict.findings]
        time.sleep(0.5)
    return f"{name:<17} NOT NAMED as {cause} on rank {rank}; said: {', '.join(said) or 'nothing'}"


# name -> how the shared load is made (the healthy twins of the CPU faults)
TWINS: dict[str, Fault] = {
    "healthy-loose": lambda job, p: loose_loops(2),
    "healthy-alike": lambda job, p: pinned_alike(list(p.values()), core=1),
    "healthy-apart": lambda job, p: _neighbours_apart(p, loops=0),
}


def healthy_twin(name: str, ranks: int) -> str:
    """HEALTHY_S of refreshes under a load every rank shares: every finding is a false one."""
    with tempfile.TemporaryDirectory() as tmp, faulty_job(Path(tmp), ranks,
                                                          entry=ENTRY) as job:
        job.start_exporter()  # the job's second target: up, so any finding is the twin's
        job.wait("stepping", stepping(ranks), 300)
        with TWINS[name](job, workers(job)):
            said: set[str] = set()
            refreshes, end = 0, time.monotonic() + HEALTHY_S
            while time.monotonic() < end:
                _snap, verdict = job.refresh()
                said |= {f"{f.cause}(rank {f.rank})" for f in verdict.findings}
                refreshes += 1
                time.sleep(0.5)
        return (f"{name:<17} {refreshes} refreshes in {HEALTHY_S:.0f}s named: "
                f"{', '.join(sorted(said)) or 'nothing'}")


def kill_all(ranks: int) -> str:
    """SIGKILL every rank: how long the pod's server outlives them, and what is left."""
    with tempfile.TemporaryDirectory() as tmp, faulty_job(Path(tmp), ranks,
                                                          entry=ENTRY) as job:
        job.wait("stepping", stepping(ranks), 300)
        port = int(job.urls[0].rsplit(":", 1)[1])
        directory = next(Path("/dev/shm").glob(f"fsdpmon-{os.getuid()}-e2e-diagnose-{port}"))
        server = podserver.server_pid(directory)
        pids = workers(job)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        while server is not None and pid_alive(server) and time.monotonic() - killed < 30:
            time.sleep(0.05)
        gone = time.monotonic() - killed
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                free = "free"
            except OSError as exc:
                free = f"NOT free ({exc})"
        left = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
        return (f"{'kill-all':<17} server {server} gone {gone:4.1f}s after the SIGKILLs "
                f"(alive: {server is not None and pid_alive(server)}); port {free}; left in "
                f"{directory.name}: {left or 'nothing'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--only", nargs="*", choices=[*FAULTS, *TWINS, "kill-all"])
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; load "
          f"average at start: " + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    for ranks in args.ranks:
        print(f"{ranks} CPU ranks (seconds from the fault starting to the first refresh "
              "naming it):", flush=True)
        for name in [*FAULTS, *TWINS, "kill-all"]:
            if args.only is None or name in args.only:
                line = (kill_all(ranks) if name == "kill-all" else
                        healthy_twin(name, ranks) if name in TWINS else run_fault(name, ranks))
                print(f"  {line}  (load {os.getloadavg()[0]:.1f})", flush=True)
    print("load average at end: " + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
