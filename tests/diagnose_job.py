"""A real job to diagnose: torchrun CPU ranks of the bundled trainer (trainer faults through
--fault) and the exporter with simulated GPUs (GPU faults through its --fault), watched the way
`fsdpmon diagnose` watches (TargetsSource + Diagnoser). The e2e test and
benchmarks/bench_diagnose.py share it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from proc_tree import kill_tree
from support import free_port

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose import Finding, Verdict
from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.sources.targets import TargetsSource

REPO = Path(__file__).resolve().parents[1]
STALL_FLOOR_S = 8.0  # the monitor's stall floor for these jobs (the shipped default is 120 s)


@dataclass
class Job:
    urls: list[str]
    train: subprocess.Popen
    exporter_args: list[str]
    env: dict[str, str]
    logs: Path
    exporter: subprocess.Popen | None = None
    exporter_started: float = 0.0  # monotonic; GPU faults' `after` counts from here
    # A lower bound on the first step (monotonic; trainer faults' `after` counts from it): the
    # start of the last refresh that saw no step.
    first_step_after: float | None = None
    _idle_at: float = field(default_factory=time.monotonic)
    source: TargetsSource = field(init=False)
    diagnoser: Diagnoser = field(init=False)

    def __post_init__(self) -> None:
        self.source = TargetsSource(self.urls, timeout_s=2.0)
        self.diagnoser = Diagnoser(self.source, 2.0)

    def start_exporter(self, gpu_fault: str = "") -> None:
        with open(self.logs / "exporter.log", "w") as out:
            self.exporter = subprocess.Popen(
                self.exporter_args + (["--fault", gpu_fault] if gpu_fault else []), cwd=REPO,
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.exporter_started = time.monotonic()
        # The watch starts over with the whole job up: the exporter's absence until now was
        # the harness's doing (target_down), not a fault to carry into the history.
        self.diagnoser = Diagnoser(self.source, 2.0)

    def refresh(self) -> tuple[JobSnapshot, Verdict]:
        began = time.monotonic()
        snap = self.source.fetch()
        if self.first_step_after is None:
            if any((r.step or 0) >= 1 for r in snap.ranks):
                self.first_step_after = self._idle_at
            else:
                self._idle_at = began
        return snap, self.diagnoser.update(snap)

    def wait(self, what: str, ready, timeout_s: float = 180.0) -> JobSnapshot:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            snap, _ = self.refresh()
            if ready(snap):
                return snap
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in sorted(self.logs.glob("*.log")))


def stepping(ranks: int, gpus: bool = False):
    """A readiness check: every rank past step 2 (and the exporter's GPUs tied to ranks)."""
    def ready(snap: JobSnapshot) -> bool:
        going = len([r for r in snap.ranks if (r.step or 0) > 2]) == ranks
        return going and (not gpus or len([g for g in snap.gpus if g.ranks]) == ranks)
    return ready


@contextlib.contextmanager
def faulty_job(tmp: Path, ranks: int = 2, train_fault: str = "",
               extra: tuple[str, ...] = (), max_restarts: int = 0,
               entry: tuple[str, ...] = ("-m", "fsdpmon.trainer.train"),
               env_extra: dict[str, str] | None = None) -> Iterator[Job]:
    """A running training (killed, with every child and the exporter, on exit); the exporter
    starts when the caller says, so GPU faults count from a known moment. ``max_restarts``:
    torchrun's, for a crash the elastic agent restarts the group after. ``entry``: what
    torchrun runs (the trainer, or tests/trainer_outside_faults.py around it). ``env_extra``: more
    environment for the job (faults from outside the injector: LD_PRELOAD, PYTHONPATH)."""
    train_port, exporter_port = free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "FSDPMON_STALL_FLOOR_SECONDS": str(STALL_FLOOR_S), "PYTHONUNBUFFERED": "1",
           **(env_extra or {})}
    env.pop("FSDPMON_FAULT", None)
    exporter_args = [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port",
                     str(exporter_port), "--listen-address", "127.0.0.1", "--interval", "1",
                     "--simulate-gpus", str(ranks)]
    train_args = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  f"--nproc_per_node={ranks}", "--max-restarts", str(max_restarts),
                  *entry,
                  "--model", "tiny", "--max-steps", "1000000", "--batch-size", "2",
                  "--seq-len", "32", "--log-every", "5", "--metrics-port", str(train_port),
                  "--job-name", "e2e-diagnose", *extra,
                  *(["--fault", train_fault] if train_fault else [])]
    with open(tmp / "train.log", "w") as out:
        train = subprocess.Popen(train_args, cwd=REPO, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    job = Job([f"127.0.0.1:{train_port}", f"127.0.0.1:{exporter_port}"], train, exporter_args,
              env, tmp)
    try:
        yield job
    finally:
        job.source.close()
        kill_tree(train)
        if job.exporter is not None:
            kill_tree(job.exporter)


def diagnose_cli(job: Job, watch: str = "12s") -> subprocess.Popen:
    """`fsdpmon diagnose --json` on the job's targets, as a person runs it (started, not
    waited for: read it with ``cli_findings``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "fsdpmon.cli", "diagnose", "--targets", ",".join(job.urls),
         "--json", "--for", watch, "--interval", "1"], cwd=REPO, env=job.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cli_findings(proc: subprocess.Popen, timeout_s: float = 90.0) -> tuple[int, list[dict]]:
    """Its exit status and the findings its JSON lists (AssertionError with stderr if none, or
    if the verdict was drawn from less than one evidence window)."""
    out, err = proc.communicate(timeout=timeout_s)
    try:
        doc = json.loads(out)
        assert doc["evidence_seconds"] >= DIAGNOSIS_EVIDENCE_SECONDS, (
            f"diagnose answered from {doc['evidence_seconds']}s of evidence (< "
            f"{DIAGNOSIS_EVIDENCE_SECONDS}s): no verdict\n{err[-2000:]}")
        return proc.returncode, doc["findings"]
    except (ValueError, KeyError) as exc:
        raise AssertionError(f"diagnose exited {proc.returncode} without its JSON ({exc}):\n"
                             f"{out[-2000:]}\n{err[-2000:]}") from None


def named(findings: tuple[Finding, ...], cause: str, rank: int | None = None,
          gpu: str | None = None) -> Finding | None:
    """The finding of ``cause`` naming that rank / GPU (None: any), if any."""
    return next((f for f in findings if f.cause == cause
                 and (rank is None or f.rank == rank) and (gpu is None or f.gpu == gpu)), None)


def workers(job: Job, script: str = "trainer_outside_faults") -> dict[int, int]:
    """rank -> PID of the job's training processes (torchrun's children running ``script``)."""
    out = {}
    for proc in psutil.Process(job.train.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            rank = proc.environ().get("RANK")
            if rank is not None and script in " ".join(proc.cmdline()):
                out[int(rank)] = proc.pid
    return out
