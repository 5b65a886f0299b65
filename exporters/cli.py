"""`fsdpmon exporter`: the per-node GPU, host and process exporter.

Wires the readers, the background sampler, the collector and the HTTP server together; every
bad flag or config file fails here, at start, with a ConfigError naming the field.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
from dataclasses import dataclass

from fsdpmon import __version__, faultspec, validate
from fsdpmon.conventions import EXPORTER_PORT
from fsdpmon.errors import ConfigError
from fsdpmon.exporters.exposition import CachedExposition
from fsdpmon.exporters.host import HostReader
from fsdpmon.exporters.nvml import NvmlReader
from fsdpmon.exporters.pods import PodIndex, api_from_config
from fsdpmon.exporters.procs import ProcessScanner
from fsdpmon.exporters.sampler import GpuSource, Sampler
from fsdpmon.exporters.simfaults import GpuFaults, exporter_faults
from fsdpmon.exporters.simulated import SimulatedReader
from fsdpmon.exporters.xid import XidWatcher
from fsdpmon.httpserve import Server, serve
from fsdpmon.signals import Catcher
from fsdpmon.webconfig import load_web_config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExporterConfig:
    port: int = EXPORTER_PORT
    listen_address: str = "0.0.0.0"
    interval_s: float = 5.0
    simulate_gpus: int = 0
    simulate_for: int = 0  # with simulate_gpus: only this process's descendants hold them
    node_name: str = ""
    web_config_file: str = ""
    proc_root: str = "/proc"
    kubeconfig: str = ""
    pod_refresh_s: float = 15.0
    max_processes: int = 512
    fault: str = ""  # --fault spec (FSDPMON_FAULT is read too); GPU kinds only

    def validate(self) -> None:
        validate.port("--port", self.port)
        validate.between("--interval", self.interval_s, 0.1, 3600.0)
        validate.non_negative("--simulate-gpus", self.simulate_gpus)
        validate.non_negative("--simulated-gpus-for", self.simulate_for)
        validate.between("--pod-refresh", self.pod_refresh_s, 1.0, 3600.0)
        validate.positive("--max-processes", self.max_processes)
        if not self.node_name:
            raise ConfigError("--node-name", "must not be empty")
        validate.listen_address("--listen-address", self.listen_address)
        if not os.path.isfile(os.path.join(self.proc_root, "stat")):
            raise ConfigError("--proc-root", f"{self.proc_root} does not look like a /proc mount")
        self.gpu_faults()

    def gpu_faults(self) -> GpuFaults:
        """The GPU faults to inject (from FSDPMON_FAULT and --fault); ConfigError when bad."""
        return exporter_faults(self.fault or None, self.simulate_gpus)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=EXPORTER_PORT,
                        help=f"port to serve /metrics and /healthz on (default {EXPORTER_PORT})")
    parser.add_argument("--listen-address", default="0.0.0.0",
                        help="address to bind (default 0.0.0.0; use 127.0.0.1 for local only)")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="seconds between background samples (default 5)")
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N",
                        help="serve N simulated GPUs (model SIMULATED) instead of reading NVML")
    parser.add_argument("--simulated-gpus-for", type=int, default=0, metavar="PID",
                        help="with --simulate-gpus: only training processes descended from PID "
                             "hold the simulated GPUs (fsdpmon demo passes its own PID, so "
                             "other jobs on the machine get none)")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname(),
                        help="node label value (default $NODE_NAME or the hostname)")
    parser.add_argument("--web-config-file", default="",
                        help="exporter-toolkit web config (TLS, basic auth)")
    parser.add_argument("--proc-root", default="/proc",
                        help="where the host's /proc is mounted (default /proc)")
    parser.add_argument("--kubeconfig", default="",
                        help="kubeconfig for pod attribution (default: in-cluster, else none)")
    parser.add_argument("--pod-refresh", type=float, default=15.0, metavar="SECONDS",
                        help="seconds between pod lists of this node (default 15)")
    parser.add_argument("--max-processes", type=int, default=512,
                        help="at most this many processes get series (default 512)")
    parser.add_argument("--fault", default="", metavar="SPEC",
                        help="inject GPU faults into the simulated GPUs, e.g. "
                             "'gpu-throttle:gpu=1,after=30,reason=thermal;xid:gpu=0,code=79,"
                             "after=60' (also read from $FSDPMON_FAULT; see the README)")


def config_from_args(args: argparse.Namespace) -> ExporterConfig:
    cfg = ExporterConfig(
        port=args.port, listen_address=args.listen_address, interval_s=args.interval,
        simulate_gpus=args.simulate_gpus, simulate_for=args.simulated_gpus_for,
        node_name=args.node_name,
        web_config_file=args.web_config_file, proc_root=args.proc_root,
        kubeconfig=args.kubeconfig, pod_refresh_s=args.pod_refresh,
        max_processes=args.max_processes, fault=args.fault,
    )
    cfg.validate()
    return cfg


@dataclass
class Exporter:
    """A running exporter: its sampler, server and helpers (stop() ends them all)."""

    sampler: Sampler
    server: Server
    gpus: GpuSource
    xid: XidWatcher | None
    pods: PodIndex | None
    tls: bool = False

    def stop(self) -> None:
        self.server.stop()
        self.sampler.stop()
        if self.xid is not None:
            self.xid.stop()
        if self.pods is not None:
            self.pods.stop()
        self.gpus.close()


def _gpu_source(cfg: ExporterConfig) -> tuple[GpuSource, XidWatcher | None]:
    if cfg.simulate_gpus:
        faults = cfg.gpu_faults()
        for fault in faults.faults:
            log.warning("fault injection: %s", faultspec.describe(fault))
        return SimulatedReader(cfg.simulate_gpus, faults=faults), None
    reader = NvmlReader()
    xid = XidWatcher(reader)
    reader.on_open = xid.start  # also when the driver only comes up later
    return reader, xid


def start(cfg: ExporterConfig) -> Exporter:
    """Start sampling and serving per ``cfg``; raises ConfigError for bad setup.

    Everything that can be wrong with the setup (web config, certificates, kubeconfig, address,
    port) is checked before any background thread starts."""
    web = load_web_config(cfg.web_config_file)
    api = api_from_config(cfg.kubeconfig or None)
    pods = PodIndex(api, cfg.node_name, cfg.pod_refresh_s) if api is not None else None
    gpus, xid = _gpu_source(cfg)
    procs = ProcessScanner(cfg.proc_root, pods.lookup if pods else None, cfg.max_processes)
    procs.holders_under = cfg.simulate_for or None
    sampler = Sampler(cfg.node_name, cfg.interval_s, gpus, HostReader(cfg.proc_root), procs)
    metrics = CachedExposition(sampler, __version__, simulated=bool(cfg.simulate_gpus))
    server = serve(metrics, cfg.listen_address, cfg.port, web, sampler.health)
    gpus.open()
    if pods is not None:
        pods.start()
    sampler.start()
    return Exporter(sampler, server, gpus, xid, pods, tls=web.tls is not None)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    # The handler only records the signal and wakes this wait (fsdpmon.signals): a second
    # SIGTERM or SIGINT changes nothing, a third ends the process at once. It is installed
    # before the exporter starts and says "serving": a SIGTERM right after that line (an
    # orchestrator that waits for it, on a loaded node) must find it, not the default action.
    with Catcher((signal.SIGTERM, signal.SIGINT)) as stop:
        exporter = start(cfg)
        scheme = "https" if exporter.tls else "http"
        log.info("fsdpmon exporter on node %s serving %s://%s:%d/metrics (interval %.1fs%s)",
                 cfg.node_name, scheme, cfg.listen_address, exporter.server.port,
                 cfg.interval_s, f", {cfg.simulate_gpus} simulated GPUs"
                 if cfg.simulate_gpus else "")
        while not stop.wait(3600):
            pass
        log.info("stopping")
        exporter.stop()
    return 0
