"""Processes worth a series: those on a GPU, in a training pod, or (outside Kubernetes) training.

Reads ``<proc_root>/<pid>/...`` directly so the exporter can run with the host's /proc mounted
anywhere (``--proc-root /host/proc``) and so a sample costs one ``stat`` read per covered process:
a node runs hundreds of processes, and only the few dozen training ones get series. What does
not change for a PID (command, user, cgroup) is read once when the PID first appears. A PID that
vanishes mid-read is skipped. The number of covered processes is capped to bound cardinality.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from fsdpmon.exporters.cgroup import CgroupRef, parse_cgroup
from fsdpmon.exporters.sample import NO_POD, PodRef, ProcessSample

log = logging.getLogger(__name__)

TRAINING_COMMAND = re.compile(
    r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b|\btrainer\.train\b|transformers.*Trainer"
)
TRAINING_ENV = (b"LOCAL_RANK=", b"FSDPMON_JOB_NAME=")  # set by torchrun / our trainer manifests
SECRET_ARG = re.compile(r"(?i)(--?[\w.-]*(?:token|password|secret|api[_-]?key)[\w.-]*)([= ])(\S+)")
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}")
COMMAND_MAX = 200
RECLASSIFY_S = 30.0  # re-read uncovered PIDs now and then: a PID may have been reused
# A process younger than this may not have exec'd yet (torchrun forks, then execs the worker):
# what it is (command, environment, LOCAL_RANK) is read again on every scan until it is older.
SETTLE_S = 2.0
STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "Z": "zombie", "T": "stopped",
          "t": "tracing-stop", "X": "dead", "I": "idle"}


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the exporter uses (times in clock ticks)."""

    comm: str
    state: str
    ppid: int
    utime: int
    stime: int
    threads: int
    start_ticks: int
    rss_pages: int


def parse_stat(text: str) -> ProcStat:
    """Parse ``/proc/<pid>/stat``; the command may hold spaces and parentheses."""
    open_paren, close_paren = text.index("("), text.rindex(")")
    rest = text[close_paren + 2 :].split()
    return ProcStat(
        comm=text[open_paren + 1 : close_paren],
        state=rest[0],
        ppid=int(rest[1]),
        utime=int(rest[11]),
        stime=int(rest[12]),
        threads=int(rest[17]),
        start_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
    )


def redact(command: str) -> str:
    """Hide secret-looking argument values (tokens, passwords) from a command line."""
    command = SECRET_ARG.sub(lambda m: f"{m.group(1)}{m.group(2)}***", command)
    return HF_TOKEN.sub("hf_***", command)


def command_line(raw: bytes, comm: str) -> str:
    args = raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    text = redact(args) if args else f"[{comm}]"
    return text[:COMMAND_MAX]


def uid_of(status_text: str) -> int | None:
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def environ_int(environ: bytes, key: bytes) -> int | None:
    """An integer variable from a NUL-separated environment (None when absent or not a number).

    Only RANK and LOCAL_RANK are ever read this way: the rest of a process's environment (it
    may hold tokens) is never kept."""
    prefix = key + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            value = entry[len(prefix):]
            return int(value) if value.isdigit() and len(value) <= 9 else None
    return None


def looks_like_training(command: str, environ: bytes) -> bool:
    if TRAINING_COMMAND.search(command):
        return True
    return any(b"\0" + key in b"\0" + environ for key in TRAINING_ENV)


@dataclass
class _Known:
    """What stays fixed for one PID's life."""

    start_ticks: int
    command: str
    user: str
    cgroup: CgroupRef | None
    training_command: bool
    seen_at: float
    rank: int | None = None
    local_rank: int | None = None
    settled: bool = True  # False: too young to trust its command and environment yet
    ppid: int = 0


PodLookup = Callable[[str, str], "PodRef | None"]


class ProcessScanner:
    """Finds and reads the covered processes under ``proc_root``."""

    def __init__(
        self,
        proc_root: str = "/proc",
        pod_lookup: PodLookup | None = None,
        max_processes: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.pod_lookup = pod_lookup
        self.max_processes = max_processes
        self._clock = clock
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._boot_time = self._read_boot_time()
        self._known: dict[int, _Known] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (clock, cpu seconds)
        self._users: dict[int, str] = {}
        self.holders_under: int | None = None  # see training_local_ranks
        self._own_pid = os.getpid()
        self._warned_cap = False

    def _read_boot_time(self) -> float:
        try:
            with open(os.path.join(self.proc_root, "stat"), encoding="ascii") as f:
                for line in f:
                    if line.startswith("btime "):
                        return float(line.split()[1])
        except OSError:
            pass
        return 0.0

    def _path(self, pid: int, name: str) -> str:
        return f"{self.proc_root}/{pid}/{name}"

    def _read(self, pid: int, name: str) -> bytes:
        with open(self._path(pid, name), "rb") as f:
            return f.read()

    # -- discovery -------------------------------------------------------------------------
    def pids(self) -> list[int]:
        return [int(d) for d in os.listdir(self.proc_root) if d.isdigit()]

    def _user(self, uid: int | None) -> str:
        if uid is None:
            return ""
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]

    def _discover(self, pid: int, now: float) -> _Known | None:
        """Read what is fixed for a new PID; None when it vanished or is unreadable."""
        try:
            stat = parse_stat(self._read(pid, "stat").decode("utf-8", "replace"))
            command = command_line(self._read(pid, "cmdline"), stat.comm)
            uid = uid_of(self._read(pid, "status").decode("utf-8", "replace"))
            cgroup = parse_cgroup(self._read(pid, "cgroup").decode("utf-8", "replace"))
        except (OSError, ValueError, IndexError):
            return None
        try:
            environ = self._read(pid, "environ")
        except OSError:  # other users' environ is private unless we run as root
            environ = b""
        training = looks_like_training(command, environ)
        age = time.time() - (self._boot_time + stat.start_ticks / self._ticks)
        return _Known(stat.start_ticks, command, self._user(uid), cgroup, training, now,
                      environ_int(environ, b"RANK"), environ_int(environ, b"LOCAL_RANK"),
                      settled=age >= SETTLE_S, ppid=stat.ppid)

    def _refresh_known(self, pids: Iterable[int], now: float) -> None:
        live = set(pids)
        for pid in list(self._known):
            if pid not in live:
                del self._known[pid]
                self._cpu.pop(pid, None)
        for pid in live:
            known = self._known.get(pid)
            if known is None or not known.settled or now - known.seen_at > RECLASSIFY_S:
                fresh = self._discover(pid, now)
                if fresh is not None:
                    self._known[pid] = fresh

    def _pod(self, known: _Known) -> PodRef | None:
        ref = known.cgroup
        if ref is None or not ref.pod_uid or self.pod_lookup is None:
            return None
        return self.pod_lookup(ref.pod_uid, ref.container_id)

    def training_pids(self) -> list[int]:
        """PIDs that are training by pod or, without a pod index, by command (for simulation)."""
        return [pid for pid, known in self._known.items() if self._covered(known)]

    def training_local_ranks(self) -> dict[int, int | None]:
        """Training PIDs with their LOCAL_RANK (None for a launcher or a plain process); with
        ``holders_under`` set, only the descendants of that process (the demo's own training,
        not another job of the same user on the machine)."""
        pids = self.training_pids()
        under = self.holders_under
        if under is not None:
            pids = [pid for pid in pids if self._descends_from(pid, under)]
        return {pid: self._known[pid].local_rank for pid in pids}

    def _descends_from(self, pid: int, ancestor: int, depth: int = 32) -> bool:
        for _ in range(depth):
            known = self._known.get(pid)
            try:
                parent = known.ppid if known is not None else parse_stat(
                    self._read(pid, "stat").decode("utf-8", "replace")).ppid
            except (OSError, ValueError, IndexError):
                return False
            if parent == ancestor:
                return True
            if parent <= 1:
                return False
            pid = parent
        return False

    def _covered(self, known: _Known) -> bool:
        if self.pod_lookup is not None:
            pod = self._pod(known)
            return bool(pod and pod.training)
        return known.training_command

    # -- sampling --------------------------------------------------------------------------
    def scan(self) -> None:
        """Update the PID table (cheap: only new PIDs are read)."""
        self._refresh_known(self.pids(), self._clock())

    def sample(self, gpu_pids: Collection[int]) -> tuple[ProcessSample, ...]:
        """Read every covered process: GPU users first, then training processes, up to the cap."""
        now = self._clock()
        on_gpu = set(gpu_pids)
        chosen = [pid for pid in sorted(on_gpu) if pid in self._known]
        chosen += sorted(p for p in self.training_pids() if p not in on_gpu)
        if len(chosen) > self.max_processes:
            if not self._warned_cap:
                log.warning("%d processes qualify; serving the first %d (--max-processes)",
                            len(chosen), self.max_processes)
                self._warned_cap = True
            chosen = chosen[: self.max_processes]
        out = []
        for pid in chosen:
            if pid == self._own_pid:
                continue
            sample = self._read_process(pid, now)
            if sample is not None:
                out.append(sample)
        return tuple(out)

    def _read_process(self, pid: int, now: float) -> ProcessSample | None:
        known = self._known[pid]
        try:
            stat = parse_stat(self._read(pid, "stat").decode("utf-8", "replace"))
        except (OSError, ValueError, IndexError):
            return None  # vanished between listing and reading
        if stat.start_ticks != known.start_ticks:
            self._known.pop(pid, None)  # PID reused: classify again on the next scan
            return None
        cpu_seconds = (stat.utime + stat.stime) / self._ticks
        previous = self._cpu.get(pid)
        self._cpu[pid] = (now, cpu_seconds)
        cpu_utilization = None
        if previous is not None and now > previous[0]:
            cpu_utilization = max(0.0, (cpu_seconds - previous[1]) / (now - previous[0]))
        return ProcessSample(
            pid=pid,
            command=known.command,
            user=known.user,
            state=STATES.get(stat.state, stat.state),
            cpu_seconds=cpu_seconds,
            rss_bytes=float(stat.rss_pages * self._page),
            threads=stat.threads,
            start_time_seconds=self._boot_time + stat.start_ticks / self._ticks,
            cpu_utilization=cpu_utilization,
            pod=self._pod(known) or NO_POD,
            rank=known.rank,
            local_rank=known.local_rank,
        )
