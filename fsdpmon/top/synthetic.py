"""Catalog-shaped expositions of a synthetic job, rendered by prometheus_client itself.

Tests, the benchmark and stand-in servers serve these so that `top` reads the same text format,
names and labels a real monitor and exporter produce, without a GPU or a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fsdpmon import catalog
from fsdpmon.conventions import SIMULATED_GPU_MODEL


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int = 0
    node: str = "node-0"
    step: int = 100
    total_steps: int | None = 1000
    step_time_s: float = 0.5
    data_wait_ratio: float = 0.02
    tokens_per_second: float = 8192.0
    mfu_ratio: float | None = 0.41
    loss: float = 2.5
    peak_memory_bytes: float = 40e9
    memory_capacity_bytes: float = 80e9
    heartbeat_age_s: float = 0.2
    stall_threshold_s: float = 30.0
    stalled: bool = False
    world_size: int = 1
    nodes: int = 1


@dataclass(frozen=True)
class GpuSpec:
    gpu: int
    utilization_ratio: float = 0.97
    memory_used_bytes: float = 60e9
    memory_total_bytes: float = 80e9
    temperature_celsius: float = 64.0
    power_watts: float = 550.0
    pod: str = ""
    pid: int = 0


def _family(name: str, labels: Sequence[str]) -> Metric:
    m = catalog.get(name)
    if m.kind is catalog.Kind.COUNTER:
        return CounterMetricFamily(m.family, m.help, labels=list(labels))
    if m.kind is catalog.Kind.HISTOGRAM:
        return HistogramMetricFamily(m.name, m.help, labels=list(labels))
    return GaugeMetricFamily(m.name, m.help, labels=list(labels))


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def _render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))  # type: ignore[arg-type]
    return generate_latest(registry)


_RANK_GAUGES = {
    "fsdpmon_train_step": "step",
    "fsdpmon_train_total_steps": "total_steps",
    "fsdpmon_train_step_time_seconds": "step_time_s",
    "fsdpmon_train_data_wait_ratio": "data_wait_ratio",
    "fsdpmon_train_tokens_per_second": "tokens_per_second",
    "fsdpmon_train_mfu_ratio": "mfu_ratio",
    "fsdpmon_train_loss": "loss",
    "fsdpmon_train_memory_peak_active_bytes": "peak_memory_bytes",
    "fsdpmon_train_device_memory_capacity_bytes": "memory_capacity_bytes",
    "fsdpmon_train_heartbeat_age_seconds": "heartbeat_age_s",
    "fsdpmon_train_stall_threshold_seconds": "stall_threshold_s",
}


def training_exposition(
    job: str, ranks: Sequence[RankSpec], job_ranks: Sequence[RankSpec] = ()
) -> bytes:
    """One training pod's /metrics: every local rank's series, as the monitor serves them.

    The pod holding rank 0 also carries the job-level series, computed over ``job_ranks``
    (all ranks of the job; the pod's own ranks when not given).
    """
    base = ("job_name", "rank", "local_rank")
    fams: dict[str, Metric] = {n: _family(n, base) for n in _RANK_GAUGES}
    info_labels = (*base, "model", "world_size", "nodes", "dtype", "torch_version", "node",
                   "device")
    info = _family("fsdpmon_train_info", info_labels)
    stalled = _family("fsdpmon_train_stalled", base)
    steps = _family("fsdpmon_train_steps_total", base)
    phases = _family("fsdpmon_train_phase_seconds_total", (*base, "phase"))
    hist = _family("fsdpmon_train_step_duration_seconds", base)
    for r in ranks:
        ids = [job, str(r.rank), str(r.local_rank)]
        info.add_metric([*ids, "llama2-7b", str(r.world_size), str(r.nodes), "bfloat16",
                         "2.13.0", r.node, "NVIDIA H100 80GB HBM3"], 1)
        for name, attr in _RANK_GAUGES.items():
            value = getattr(r, attr)
            if value is not None:
                fams[name].add_metric(ids, float(value))
        stalled.add_metric(ids, 1.0 if r.stalled else 0.0)
        steps.add_metric(ids, float(r.step))
        for i, phase in enumerate(("data", "forward", "backward", "optimizer")):
            phases.add_metric([*ids, phase], r.step * r.step_time_s * (0.1 + 0.2 * i))
        buckets = [(str(b), float(r.step if b >= r.step_time_s else 0))
                   for b in catalog.STEP_BUCKETS] + [("+Inf", float(r.step))]
        hist.add_metric(ids, buckets, r.step * r.step_time_s)  # type: ignore[arg-type]
    if ranks and ranks[0].local_rank == 0 and ranks[0].rank == 0:
        fams.update(_job_families(job, job_ranks or ranks))
    return _render([info, *fams.values(), stalled, steps, phases, hist])


def _job_families(job: str, ranks: Sequence[RankSpec]) -> dict[str, Metric]:
    times = sorted(r.step_time_s for r in ranks)
    slowest = max(ranks, key=lambda r: r.step_time_s)
    values = {
        "fsdpmon_job_step_time_median_seconds": times[len(times) // 2],
        "fsdpmon_job_step_time_max_seconds": times[-1],
        "fsdpmon_job_slowest_rank": slowest.rank,
        "fsdpmon_job_world_size": ranks[0].world_size,
    }
    out = {}
    for name, value in values.items():
        fam = _family(name, ("job_name",))
        fam.add_metric([job], float(value))
        out[name] = fam
    return out


_GPU_GAUGES = {
    "fsdpmon_gpu_utilization_ratio": "utilization_ratio",
    "fsdpmon_gpu_memory_used_bytes": "memory_used_bytes",
    "fsdpmon_gpu_memory_total_bytes": "memory_total_bytes",
    "fsdpmon_gpu_temperature_celsius": "temperature_celsius",
    "fsdpmon_gpu_power_watts": "power_watts",
}
_GPU_EXTRA = (
    "fsdpmon_gpu_memory_free_bytes", "fsdpmon_gpu_memory_utilization_ratio",
    "fsdpmon_gpu_sm_clock_hertz", "fsdpmon_gpu_memory_clock_hertz", "fsdpmon_gpu_power_limit_watts",
    "fsdpmon_gpu_memory_temperature_celsius", "fsdpmon_gpu_energy_joules_total",
    "fsdpmon_gpu_pcie_replay_errors_total",
)


def exporter_exposition(node: str, gpus: Sequence[GpuSpec], namespace: str = "default") -> bytes:
    """One node exporter's /metrics: GPUs, host and the training processes."""
    gl = ("gpu", "uuid", "model", "node", "namespace", "pod", "container")
    fams = {n: _family(n, gl) for n in (*_GPU_GAUGES, *_GPU_EXTRA)}
    up = _family("fsdpmon_gpu_up", gl[:4])
    pl = ("node", "pid", "namespace", "pod", "container")
    pinfo = _family("fsdpmon_process_info", (*pl, "command", "user"))
    pcpu = _family("fsdpmon_process_cpu_utilization_ratio", pl)
    prss = _family("fsdpmon_process_resident_memory_bytes", pl)
    pgpu = _family("fsdpmon_gpu_process_memory_used_bytes", (*gl, "pid"))
    for g in gpus:
        ids = [str(g.gpu), f"GPU-{node}-{g.gpu:04d}", SIMULATED_GPU_MODEL, node]
        attribution = [namespace if g.pod else "", g.pod, "trainer" if g.pod else ""]
        up.add_metric(ids, 1.0)
        for name, attr in _GPU_GAUGES.items():
            fams[name].add_metric([*ids, *attribution], float(getattr(g, attr)))
        for name in _GPU_EXTRA:
            fams[name].add_metric([*ids, *attribution], 1.0)
        if g.pid:
            proc = [node, str(g.pid), *attribution]
            pinfo.add_metric([*proc, f"python -m trainer.train --local-rank {g.gpu}", "root"], 1)
            pcpu.add_metric(proc, 1.0)
            prss.add_metric(proc, 12e9)
            pgpu.add_metric([*ids, *attribution, str(g.pid)], g.memory_used_bytes)
    return _render([up, *fams.values(), pinfo, pcpu, prss, pgpu, *_host_families(node)])


def _host_families(node: str) -> list[Metric]:
    info = _family("fsdpmon_exporter_info", ("node", "version", "simulated"))
    info.add_metric([node, "0.1.0", "true"], 1)
    cpu = _family("fsdpmon_host_cpu_utilization_ratio", ("node", "cpu"))
    cpu.add_metric([node, "all"], 0.35)
    for core in range(4):
        cpu.add_metric([node, str(core)], 0.3)
    out = [info, cpu]
    for name, value in (("fsdpmon_host_memory_total_bytes", 2e12),
                        ("fsdpmon_host_memory_used_bytes", 5e11), ("fsdpmon_host_load1", 12.0)):
        fam = _family(name, ("node",))
        fam.add_metric([node], value)
        out.append(fam)
    return out


def job_expositions(job: str, nodes: int, gpus_per_node: int) -> dict[str, bytes]:
    """Every payload of a healthy job: ``/train/<node>`` and ``/node/<node>`` paths → body."""
    world = nodes * gpus_per_node
    out: dict[str, bytes] = {}
    everyone = [RankSpec(rank=r, local_rank=r % gpus_per_node, world_size=world, nodes=nodes,
                         node=f"node-{r // gpus_per_node:03d}",
                         step_time_s=0.5 + 0.001 * (r % gpus_per_node)) for r in range(world)]
    for n in range(nodes):
        node = f"node-{n:03d}"
        ranks = everyone[n * gpus_per_node:(n + 1) * gpus_per_node]
        gpus = [GpuSpec(gpu=i, pod=f"{job}-worker-{n}", pid=1000 + i)
                for i in range(gpus_per_node)]
        out[f"/train/{node}"] = training_exposition(job, ranks, everyone)
        out[f"/node/{node}"] = exporter_exposition(node, gpus)
    return out


class PayloadServer:
    """A loopback stand-in for many pods: serves ``payloads[path]`` (mutable) with 200, else 404.

    prometheus_client's server serves one registry per port; a benchmark of 512 pods needs one
    process to answer for many, so this maps paths to pre-rendered expositions instead. It
    answers HTTP/1.0 GETs with one write and no header parsing: on a 2-core machine the stand-in
    shares the CPU with the `top` being measured, and real pods would not.
    """

    def __init__(self, payloads: dict[str, bytes], host: str = "127.0.0.1") -> None:
        import socketserver
        import threading

        outer = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                request = self.rfile.readline(65537).split()
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # request headers: not needed
                path = request[1].decode("latin-1").split("?", 1)[0] if len(request) > 1 else ""
                body = outer.payloads.get(path)
                status = b"200 OK" if body is not None else b"404 Not Found"
                body = b"not found\n" if body is None else body
                self.wfile.write(b"HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; "
                                 b"charset=utf-8\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, len(body), body))

        class Server(socketserver.ThreadingTCPServer):
            # One process answers for many pods, each of which would have its own listen
            # queue: the default backlog of 5 would drop concurrent SYNs (1 s retransmits).
            request_queue_size = 1024
            daemon_threads = True
            allow_reuse_address = True

        self.payloads = payloads
        self.httpd = Server((host, 0), Handler)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
