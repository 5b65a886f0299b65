"""One demo session: plan it, start the exporter and the training, wait until both serve, stop.

The plan is plain data (which commands, which ports, which logs), so it can be printed for the
person watching and checked by tests without starting anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fsdpmon import faultspec
from fsdpmon.conventions import SIMULATED_GPU_MODEL
from fsdpmon.demo.processes import Child, spawn, stop_all
from fsdpmon.demo.source import DemoSource
from fsdpmon.errors import ConfigError, JobUnhealthyError
from fsdpmon.job.snapshot import JobSnapshot

JOB_NAME = "fsdpmon-demo"
LOOPBACK = "127.0.0.1"
# How often the start-up looks for every rank stepping: two local endpoints, a few ms a look,
# and short enough that a run of a few dozen steps is seen while it trains.
READY_POLL_S = 0.25


@dataclass(frozen=True)
class DemoConfig:
    nproc: int = 2
    model: str = "tiny"
    max_steps: int = 1_000_000  # effectively "until stopped"
    log_every: int = 10
    batch_size: int = 4
    seq_len: int = 128
    headless: bool = False
    duration_s: float = 30.0
    json: bool = False
    interval_s: float = 2.0
    startup_timeout_s: float = 180.0
    log_dir: Path | None = None
    metrics_port: int = 0  # 0: pick a free port
    exporter_port: int = 0
    fault: str = ""  # fsdpmon.faultspec: trainer kinds go to the ranks, GPU kinds to the exporter

    def validate(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("--nproc", self.nproc >= 1, "must be >= 1"),
            ("--max-steps", self.max_steps >= 1, "must be >= 1"),
            ("--duration", self.duration_s > 0, "must be > 0 seconds"),
            ("--interval", self.interval_s > 0, "must be > 0 seconds"),
            ("--startup-timeout", self.startup_timeout_s > 0, "must be > 0 seconds"),
            ("--metrics-port", 0 <= self.metrics_port <= 65535, "must be a TCP port (0: free)"),
            ("--exporter-port", 0 <= self.exporter_port <= 65535, "must be a TCP port (0: free)"),
        ]
        for name, ok, problem in checks:
            if not ok:
                raise ConfigError(name, problem)
        for fault in self.faults():
            rank = getattr(fault, "rank", 0)
            if rank >= self.nproc:
                raise ConfigError("--fault", f"{faultspec.describe(fault)} names rank {rank}, "
                                             f"but the demo runs {self.nproc} (--nproc)")

    def faults(self) -> tuple[faultspec.Fault, ...]:
        return faultspec.parse(self.fault, "--fault")


@dataclass(frozen=True)
class Plan:
    log_dir: Path
    metrics_port: int
    exporter_port: int
    simulated_gpus: int  # 0: the exporter reads the real GPUs through NVML
    cuda: bool  # the ranks train on CUDA GPUs (else CPU with gloo)
    trainer_argv: list[str]
    exporter_argv: list[str]
    trainer_env: dict[str, str] = field(repr=False, default_factory=dict)
    faults: tuple[str, ...] = ()  # each injected fault, spelled out (for the banner)

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    @property
    def exporter_url(self) -> str:
        return f"http://{LOOPBACK}:{self.exporter_port}/metrics"

    @property
    def jsonl_path(self) -> Path:
        return self.log_dir / "train.jsonl"


def free_port() -> int:
    """A port free on loopback right now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def real_gpu_count() -> int:
    """GPUs NVML can read here; 0 when there is no driver (the exporter owns pynvml)."""
    from fsdpmon.exporters.nvml import NvmlReader

    # "NVML unavailable" is expected
    logging.getLogger("fsdpmon.exporters.nvml").setLevel(logging.ERROR)
    reader = NvmlReader()
    try:
        return len(reader.identities) if reader.open() else 0
    finally:
        reader.close()


def make_plan(cfg: DemoConfig, gpus: int) -> Plan:
    log_dir = cfg.log_dir or Path(tempfile.mkdtemp(prefix="fsdpmon-demo-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    metrics_port = cfg.metrics_port or free_port()
    exporter_port = cfg.exporter_port or free_port()
    cuda = gpus >= cfg.nproc  # one GPU per rank, or all ranks on CPU
    simulated = 0 if gpus else cfg.nproc
    trainer_faults, gpu_faults = _split_faults(cfg, simulated)
    env = {**os.environ, "FSDPMON_LISTEN_ADDRESS": LOOPBACK, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # ranks share the cores; oversubscription crawls
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # fewer GPUs than ranks: train on CPU (gloo)
    trainer = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={cfg.nproc}", "-m", "fsdpmon.trainer.train",
        "--model", cfg.model, "--max-steps", str(cfg.max_steps),
        "--log-every", str(cfg.log_every), "--batch-size", str(cfg.batch_size),
        "--seq-len", str(cfg.seq_len), "--metrics-port", str(metrics_port),
        "--job-name", JOB_NAME, "--log-jsonl", str(log_dir / "train.jsonl"),
        *(["--fault", trainer_faults] if trainer_faults else []),
    ]
    exporter = [
        sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(exporter_port),
        "--listen-address", LOOPBACK, "--interval", "1",
        # the simulated GPUs go to this demo's workers only, not to other jobs on the machine
        *(["--simulate-gpus", str(simulated), "--simulated-gpus-for", str(os.getpid())]
          if simulated else []),
        *(["--fault", gpu_faults] if gpu_faults else []),
    ]
    spelled = tuple(faultspec.describe(f) for f in cfg.faults())
    return Plan(log_dir, metrics_port, exporter_port, simulated, cuda, trainer, exporter, env,
                spelled)


def _split_faults(cfg: DemoConfig, simulated: int) -> tuple[str, str]:
    """The spec for the ranks and the one for the exporter; ConfigError when the GPU faults
    cannot be injected here (real GPUs are never faulted) or name a GPU the demo lacks."""
    faults = cfg.faults()
    gpu = [f for f in faults if isinstance(f, faultspec.GPU_KINDS)]
    if gpu and not simulated:
        raise ConfigError("--fault", "GPU faults are injected into simulated GPUs only, and "
                                     "this machine has real ones")
    for f in gpu:
        if f.gpu >= simulated:
            raise ConfigError("--fault", f"{faultspec.describe(f)} names GPU {f.gpu}, but the "
                                         f"demo simulates {simulated} (one per rank: --nproc)")
    trainer = [f for f in faults if not isinstance(f, faultspec.GPU_KINDS)]
    return (";".join(map(faultspec.describe, trainer)), ";".join(map(faultspec.describe, gpu)))


def describe(plan: Plan, cfg: DemoConfig) -> list[str]:
    """What the person is told before anything starts."""
    gpus = (
        f"{plan.simulated_gpus} SIMULATED GPUs (no NVML here; they report model "
        f"{SIMULATED_GPU_MODEL!r})" if plan.simulated_gpus else "the real GPUs (NVML)"
    )
    device = "CUDA (NCCL)" if plan.cuda else "CPU (gloo)"
    return [
        f"logs: {plan.log_dir}/ (exporter.log, train.log, train.rank<k>.jsonl)",
        f"exporter: {plan.exporter_url}  host and process metrics, {gpus}",
        f"training: {cfg.nproc} ranks of model {cfg.model!r} on {device}, "
        f"metrics at {plan.metrics_url}",
        *(f"fault injected: {f}  (watch for it in the views and the 5 Diagnosis view)"
          for f in plan.faults),
    ]


class Session:
    """Owns the children; ``stop()`` is safe to call at any time, more than once."""

    def __init__(self, plan: Plan, say: Callable[[str], None]) -> None:
        self.plan = plan
        self.say = say
        self.children: list[Child] = []
        self.source = DemoSource([plan.metrics_url, plan.exporter_url], JOB_NAME, plan.log_dir,
                                 self.pids, self.training_exit_code)

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.say("starting exporter ...")
        self.children.append(spawn("exporter", self.plan.exporter_argv,
                                   self.plan.log_dir / "exporter.log", env))
        self.say("starting training (torchrun) ...")
        self.children.append(spawn("training", self.plan.trainer_argv,
                                   self.plan.log_dir / "train.log", self.plan.trainer_env))

    def training_finished(self) -> bool:
        """The training reached --max-steps and exited cleanly."""
        return self.training_exit_code() == 0

    def training_exit_code(self) -> int | None:
        """torchrun's exit status once it has exited (None while it runs)."""
        codes = [c.exit_code() for c in self.children if c.name == "training"]
        return codes[0] if codes else None

    def pids(self) -> set[int]:
        """Every process the demo started, torchrun's workers included."""
        for child in self.children:
            child.remember_tree()
        return {pid for child in self.children for pid in child.known}

    def check_children(self, finished_ok: bool = False) -> None:
        """Raise when a child has exited (a cleanly finished training only if not
        ``finished_ok``); the message points at its log."""
        for child in self.children:
            child.remember_tree()
            code = child.exit_code()
            if code is None or (finished_ok and code == 0 and child.name == "training"):
                continue
            what = "finished early" if code == 0 else f"exited with status {code}"
            tail = child.log_tail()
            raise JobUnhealthyError(
                f"{child.name} {what}; see {child.log_path}"
                + (f" (last lines: {tail})" if tail else "")
            )

    def wait_ready(self, nproc: int, timeout_s: float) -> JobSnapshot:
        """Until every rank has reported a step and the exporter answers, or the training has
        already reached --max-steps and exited (a short run on a fast machine is done, not
        broken: ``training_finished()`` says which)."""
        deadline = time.monotonic() + timeout_s
        last_said = 0.0
        while True:
            self.check_children(finished_ok=True)
            if self.training_finished():
                return self.source.fetch()
            snap = self.source.fetch()
            stepping = [r for r in snap.ranks if r.step is not None and not r.down]
            if len(stepping) >= nproc and all(t.up for t in snap.targets):
                return snap
            now = time.monotonic()
            if now > deadline:
                down = "; ".join(f"{t.url}: {t.error}" for t in snap.targets if not t.up)
                raise JobUnhealthyError(
                    f"not ready after {timeout_s:g}s ({len(stepping)} of {nproc} ranks "
                    f"stepping{'; ' + down if down else ''}); logs in {self.plan.log_dir}"
                )
            if now - last_said > 10:
                self.say(f"waiting for {nproc} ranks to take a step "
                         f"({len(stepping)} so far) ...")
                last_said = now
            time.sleep(READY_POLL_S)

    def stop(self) -> None:
        if not self.children:
            return
        self.say("stopping training and exporter ...")
        killed = stop_all(self.children)
        if killed:
            self.say("had to SIGKILL: " + ", ".join(killed))
        self.children = []
        with contextlib.suppress(Exception):
            self.source.close()
