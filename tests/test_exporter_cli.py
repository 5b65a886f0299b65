"""`fsdpmon exporter` end to end: real command, real HTTP, promtool, shutdown, bad flags."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_tree import kill_tree

from tests.exporter_api_standin import CID, UID, FakeApi, pod, write_kubeconfig

FIXTURE = Path(__file__).parent / "fixtures" / "proc"
SERVING = re.compile(r"serving (https?)://([\d.]+):(\d+)/metrics")


class Running:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fsdpmon.cli", "exporter", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.log.append(line)
            match = pattern.search(line)
            if match:
                return match
        raise AssertionError("exporter did not start:\n" + "".join(self.log))

    def kill(self) -> None:
        kill_tree(self.proc)


@pytest.fixture
def exporters() -> Iterator:
    started: list[Running] = []

    def start(*args: str) -> Running:
        running = Running(list(args))
        started.append(running)
        return running

    yield start
    for running in started:
        running.kill()


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def test_serves_simulated_gpus_host_and_processes_and_stops_on_sigterm(exporters) -> None:
    running = exporters("--simulate-gpus", "8", "--port", "0", "--listen-address", "127.0.0.1",
                        "--interval", "0.5", "--node-name", "test-node",
                        "--proc-root", str(FIXTURE))
    match = running.wait_for(SERVING)
    base = f"http://127.0.0.1:{match.group(3)}"
    status, text = _get(base + "/metrics")
    assert status == 200
    assert text.count('fsdpmon_gpu_up{gpu=') == 8 and 'model="SIMULATED"' in text
    assert 'fsdpmon_exporter_info{node="test-node",simulated="true"' in text
    assert 'fsdpmon_host_load1{node="test-node"} 3.5' in text
    assert re.search(r'fsdpmon_process_info\{command="/usr/bin/python -u -m fsdpmon.trainer.train '
                     r'--model tiny",container="",local_rank="0",namespace="",node="test-node",'
                     r'pid="1001",pod="",rank="0"', text)
    assert "hf_abcdefghijklmnopqrstuvwx" not in text  # secrets never reach labels
    check = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                           capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert _get(base + "/healthz") == (200, "ok\n")
    # Values move between samples.
    energy = re.compile(r'fsdpmon_gpu_energy_joules_total\{[^}]*gpu="0"[^}]*\} (\S+)')
    first = float(energy.search(text).group(1))
    deadline = time.monotonic() + 30  # the sampler's interval is 0.5 s: generous
    while float(energy.search(_get(base + "/metrics")[1]).group(1)) <= first:
        assert time.monotonic() < deadline, f"energy still {first} J after 30 s"
        time.sleep(0.1)
    os.killpg(running.proc.pid, signal.SIGTERM)
    assert running.proc.wait(10) == 0


def test_without_a_driver_it_serves_host_metrics_and_nvml_down(exporters) -> None:
    running = exporters("--port", "0", "--listen-address", "127.0.0.1", "--interval", "0.5",
                        "--node-name", "no-gpu")
    match = running.wait_for(SERVING)
    text = _get(f"http://127.0.0.1:{match.group(3)}/metrics")[1]
    if 'fsdpmon_nvml_up{node="no-gpu"} 1.0' in text:  # pragma: no cover - GPU machines
        pytest.skip("an NVIDIA driver is present")
    assert 'fsdpmon_nvml_up{node="no-gpu"} 0.0' in text
    assert 'fsdpmon_host_memory_total_bytes{node="no-gpu"}' in text
    assert "fsdpmon_gpu_utilization_ratio" not in text


def _busy_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "--interval: must be between 0.1 and 3600"),
        (["--simulate-gpus", "-1"], "--simulate-gpus: must be >= 0"),
        (["--port", "70000"], "--port: must be a TCP port"),
        (["--proc-root", "/nonexistent"], "--proc-root: /nonexistent does not look like"),
        (["--node-name", ""], "--node-name: must not be empty"),
        (["--web-config-file", "/nonexistent.yaml"], "--web-config-file: cannot read"),
        (["--kubeconfig", "/nonexistent"], "--kubeconfig: no such file"),
        (["--listen-address", "no-such-host.invalid"], "--listen-address: cannot listen on"),
        (["--listen-address", "192.0.2.1"], "--listen-address: cannot listen on"),
        (["--simulate-gpus", "2", "--fault", "xid:gpu=0,code=x"],
         "--fault: bad fault spec 'xid:gpu=0,code=x': xid code must be an integer"),
        (["--fault", "gpu-lost:gpu=0"], "--fault: GPU faults are injected into simulated GPUs"),
    ],
)
def test_bad_flags_fail_with_one_line_naming_the_field(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fsdpmon.cli", "exporter", "--listen-address", "127.0.0.1",
         "--port", "0", *args], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert f"fsdpmon exporter: error: {message}" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_names_the_port() -> None:
    sock, port = _busy_port()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "fsdpmon.cli", "exporter", "--listen-address", "127.0.0.1",
             "--port", str(port), "--simulate-gpus", "1"],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        sock.close()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--port: cannot listen on 127.0.0.1:{port}" in result.stderr


def test_in_kubernetes_gpu_and_process_series_carry_pod_labels(exporters, tmp_path) -> None:
    api = FakeApi()
    try:
        api.pods = [pod(UID, "llama-worker-0", labels={"training.kubeflow.org/job-name": "llama"},
                        containers=(("trainer", CID), ("sidecar", "b" * 64)))]
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        running = exporters("--simulate-gpus", "2", "--port", "0", "--listen-address",
                            "127.0.0.1", "--interval", "0.3", "--node-name", "node-a",
                            "--proc-root", str(FIXTURE), "--kubeconfig", str(kubeconfig))
        base = f"http://127.0.0.1:{running.wait_for(SERVING).group(3)}"
        pod_labels = 'container="trainer",gpu="0",model="SIMULATED",namespace="ml",node="node-a"'
        deadline = time.monotonic() + 20
        text = ""
        while time.monotonic() < deadline and pod_labels not in text:
            time.sleep(0.3)
            text = _get(base + "/metrics")[1]
        assert f"fsdpmon_gpu_utilization_ratio{{{pod_labels},pod=\"llama-worker-0\"" in text
        # the sidecar runs no torchrun worker (no LOCAL_RANK): it holds no GPU
        assert 'fsdpmon_gpu_utilization_ratio{container="",gpu="1"' in text
        assert ('fsdpmon_process_resident_memory_bytes{container="trainer",namespace="ml",'
                'node="node-a",pid="1001",pod="llama-worker-0"}') in text
        # In Kubernetes the pod decides: torchrun outside any training pod gets no series.
        assert 'pid="3000"' not in text
        assert api.requests[0]["query"]["fieldSelector"] == ["spec.nodeName=node-a"]
    finally:
        api.close()


def test_unusable_certificate_fails_at_start_naming_the_field(tmp_path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    (tmp_path / "key.pem").write_text("not a key\n")
    web = tmp_path / "web.yaml"
    web.write_text(f"tls_server_config:\n  cert_file: {tmp_path / 'cert.pem'}\n"
                   f"  key_file: {tmp_path / 'key.pem'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "fsdpmon.cli", "exporter", "--listen-address", "127.0.0.1",
         "--port", "0", "--simulate-gpus", "1", "--web-config-file", str(web)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "fsdpmon exporter: error: tls_server_config.cert_file: cannot load" in result.stderr
