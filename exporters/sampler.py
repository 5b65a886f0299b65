"""The background sampler: reads every source on its own interval; scrapes serve its latest sample.

So a scrape's cost does not grow with the number of scrapers, and a slow or hung NVML call never
blocks one: the GPU read runs in its own daemon thread with a deadline; when it misses the
deadline the sample carries the previous GPU reading, marked stale, while host and process data
stay fresh. A read still hanging is not started again until it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from fsdpmon.exporters.host import HostReader
from fsdpmon.exporters.procs import ProcessScanner
from fsdpmon.exporters.sample import GpuReading, HostSample, NodeSample, ProcessSample

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    """NvmlReader or SimulatedReader."""

    up: bool

    def open(self) -> bool: ...

    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


class Sampler:
    def __init__(
        self,
        node: str,
        interval_s: float,
        gpus: GpuSource,
        host: HostReader,
        procs: ProcessScanner,
        gpu_timeout_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self.gpus = gpus
        self.host = host
        self.procs = procs
        self.gpu_timeout_s = gpu_timeout_s if gpu_timeout_s is not None else min(interval_s, 5.0)
        self._clock = clock
        self._latest: NodeSample | None = None
        self._last_gpu = GpuReading(nvml_up=gpus.up)
        self._gpu_thread: threading.Thread | None = None
        self._errors: dict[str, int] = {"nvml": 0, "host": 0, "processes": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- scrape side -----------------------------------------------------------------------
    def latest(self) -> NodeSample | None:
        return self._latest  # replaced whole, never mutated: safe to read without a lock

    def stale_after_s(self) -> float:
        return 2 * self.interval_s + self.gpu_timeout_s + 1.0

    def age_s(self, sample: NodeSample) -> float:
        return max(0.0, self._clock() - sample.taken_at)

    def is_stale(self, sample: NodeSample | None) -> bool:
        """No sample, an old one (the sampler is stuck), or one whose GPU part is old."""
        if sample is None:
            return True
        return sample.gpu_stale or self.age_s(sample) > self.stale_after_s()

    def health(self) -> tuple[bool, str]:
        """For /healthz: the sampler thread runs and its last sample is recent."""
        latest = self._latest
        if not self.alive() or latest is None:
            return False, "sampler not running"
        age = self.age_s(latest)
        if age > self.stale_after_s():
            return False, f"last sample is {age:.0f}s old"
        return True, "ok"

    # -- sampling --------------------------------------------------------------------------
    def sample_once(self) -> NodeSample:
        durations: dict[str, float] = {}
        started = time.perf_counter()
        self._timed(durations, "processes", self.procs.scan)
        use = getattr(self.gpus, "use_processes", None)
        if use is not None:  # simulated GPUs are "used" by the training processes
            use(self.procs.training_local_ranks())
        t0 = time.perf_counter()
        gpu, gpu_stale = self._read_gpus()
        durations["nvml"] = time.perf_counter() - t0
        self._errors["nvml"] += gpu.errors if not gpu_stale else 0
        gpu_pids = {p.pid for g in gpu.gpus for p in g.processes}
        processes: tuple[ProcessSample, ...] = self._timed(
            durations, "processes", lambda: self.procs.sample(gpu_pids), default=(), add=True
        )
        host: HostSample | None = self._timed(durations, "host", self.host.read, default=None)
        durations["total"] = time.perf_counter() - started
        sample = NodeSample(
            node=self.node,
            taken_at=self._clock(),
            gpu=gpu,
            host=host,
            processes=processes,
            durations=durations,
            errors_total=dict(self._errors),
            gpu_stale=gpu_stale,
        )
        self._latest = sample
        return sample

    def _timed(self, durations: dict[str, float], source: str, fn: Callable[[], Any],
               default: Any = None, add: bool = False) -> Any:
        """Run one source's read, timing it; its failure costs that source, never the sample."""
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as exc:  # a bad /proc entry or a bug in one source must not stop others
            self._errors[source] = self._errors.get(source, 0) + 1
            log.warning("sampling %s failed: %s", source, exc)
            return default
        finally:
            spent = time.perf_counter() - t0
            durations[source] = durations.get(source, 0.0) + spent if add else spent

    def _read_gpus(self) -> tuple[GpuReading, bool]:
        """The GPU reading and whether it is stale (the NVML call missed its deadline)."""
        if self._gpu_thread is not None and self._gpu_thread.is_alive():
            return self._last_gpu, True
        box: dict[str, GpuReading] = {}

        def read() -> None:
            try:
                box["reading"] = self.gpus.read()
            except Exception as exc:  # a reader bug must not kill the sampler
                self._errors["nvml"] += 1
                log.warning("reading GPUs failed: %s", exc)

        # Daemon, so a call hung inside the driver can never block the exporter from exiting.
        self._gpu_thread = threading.Thread(target=read, name="fsdpmon-gpu-read", daemon=True)
        self._gpu_thread.start()
        self._gpu_thread.join(self.gpu_timeout_s)
        if "reading" not in box:
            if self._gpu_thread.is_alive():
                log.warning("NVML read exceeded %.1fs: serving the previous GPU sample as stale",
                            self.gpu_timeout_s)
            return self._last_gpu, True
        self._last_gpu = box["reading"]
        return self._last_gpu, False

    # -- background loop -------------------------------------------------------------------
    def start(self) -> None:
        self.sample_once()  # the first scrape already has data
        self._thread = threading.Thread(target=self._run, name="fsdpmon-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.sample_once()
            except Exception:  # keep sampling whatever happened; the error is logged
                log.exception("sample failed")
            next_at += self.interval_s
            if next_at < time.monotonic():  # fell behind (slow sample): do not burst
                next_at = time.monotonic() + self.interval_s
