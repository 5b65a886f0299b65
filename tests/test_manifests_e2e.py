"""The generated pod really trains: run its container command and environment on this machine.

No cluster here, so this plays the kubelet and the training operator for one Master pod: it
resolves the container's env (downward API values, the optional HF token Secret absent), adds
the PET_* variables the operator sets, and runs the command as written (real torchrun, 2 CPU
ranks, the tiny model). The only change is the metrics port: tests run side by side, so the
fixed 9520 becomes a free port. Then: the monitor serves the job's series on the declared port,
and the JSONL logs and the checkpoint land on the data volume where the manifests put them.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from proc_tree import kill_tree
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from fsdpmon import conventions as conv
from fsdpmon.manifests import ManifestConfig
from fsdpmon.manifests.training import pytorchjob

JOB = "tiny-e2e"
pytestmark = pytest.mark.slow


def pod_env(container: dict, pod_name: str) -> dict[str, str]:
    """What the kubelet would put in the environment (Secrets absent: optional refs drop)."""
    # The pod's IP is this machine's loopback here: the endpoint must serve on it alone.
    downward = {"metadata.name": pod_name, "spec.nodeName": "node-a",
                "status.podIP": "127.0.0.1"}
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            env[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            assert var["valueFrom"]["secretKeyRef"]["optional"] is True
    return env


def scrape(url: str, deadline: float) -> str:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
            if 'job_name="' + JOB + '"' in text and 'rank="1"' in text:
                return text
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no training series at {url} before the deadline")


def test_generated_master_pod_trains_and_serves_metrics(tmp_path):
    cfg = ManifestConfig(job_name=JOB, image="local/fsdp:test", exporter_image="local/e:test",
                         nodes=1, gpus_per_node=2, model="tiny", max_steps=150, seq_len=32,
                         batch_size=2, log_every=5, checkpoint_every=0, data_mount=str(tmp_path))
    job = pytorchjob(cfg)
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    (port,) = container["ports"]
    assert port["name"] == conv.TRAINING_PORT_NAME

    metrics_port = free_port()
    command = list(container["command"])
    command[command.index("--metrics-port") + 1] = str(metrics_port)
    assert command[0] == "torchrun"
    command[0:1] = [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, **pod_env(container, f"{JOB}-master-0"),
           "FSDPMON_PORT": str(metrics_port), "OMP_NUM_THREADS": "1",
           # What the training operator adds for a PyTorchJob with one Master:
           "PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE":
               job["spec"]["nprocPerNode"], "PET_MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_PORT": str(free_port())}
    env.pop("HF_TOKEN", None)

    proc = subprocess.Popen(command, env=env, cwd=Path(__file__).resolve().parents[1],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        text = scrape(f"http://127.0.0.1:{metrics_port}/metrics", time.monotonic() + 150)
        output, _ = proc.communicate(timeout=240)
    finally:
        kill_tree(proc)  # torchrun's workers are in sessions of their own
    assert proc.returncode == 0, output[-3000:]

    ranks = {s.labels.get("rank") for fam in text_string_to_metric_families(text)
             for s in fam.samples if s.labels.get("job_name") == JOB}
    assert {"0", "1"} <= ranks

    runs = tmp_path / "runs" / JOB
    for rank in (0, 1):
        lines = (runs / f"train.rank{rank}.jsonl").read_text().splitlines()
        first = json.loads(lines[0])
        assert (first["kind"], first["job_name"], first["world_size"]) == ("run", JOB, 2)
        records = [json.loads(line) for line in lines]
        # it stepped, then ended as a finished run says (the flight recorder's end record)
        assert any(r["kind"] == "step" for r in records), [r["kind"] for r in records]
        last = records[-1]
        assert (last["kind"], last.get("how")) == ("end", conv.EXIT_NORMAL), last
    checkpoints = tmp_path / "checkpoints" / JOB
    assert checkpoints.is_dir() and any(checkpoints.iterdir())


def test_generated_exporter_container_serves_its_probes_and_metrics():
    """The DaemonSet's command and args, run here: only the port/address (tests run side by
    side) and simulated GPUs (no NVML here) are added; the probes' path must answer."""
    from fsdpmon.manifests import generate

    cfg = ManifestConfig(job_name=JOB, image="local/fsdp:test", exporter_image="local/e:test",
                         components=("exporter",))
    ds = next(o for o in generate(cfg).objects if o["kind"] == "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    port = free_port()
    args = [a.replace("$(NODE_NAME)", "node-a") for a in container["args"]]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--listen-address") + 1] = "127.0.0.1"
    assert container["command"] == ["fsdpmon"]
    env = {**os.environ, "NODE_NAME": "node-a", "KUBECONFIG": "/nonexistent"}
    proc = subprocess.Popen([sys.executable, "-m", "fsdpmon.cli", *args, "--simulate-gpus", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        probe = container["readinessProbe"]["httpGet"]
        assert probe["port"] == conv.EXPORTER_PORT_NAME == container["ports"][0]["name"]
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe['path']}",
                                            timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.communicate()[0][-2000:]
                assert time.monotonic() < deadline, "exporter never became ready"
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert 'node="node-a"' in text
    finally:
        kill_tree(proc)
