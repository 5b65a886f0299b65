"""Faults made from outside fsdpmon's own injector (no FSDPMON_FAULT, no --fault, no simulated
GPUs), each named by the diagnosis with its culprit:

- a GPU fault through a stand-in for the driver's library (tests/fake_libnvml.c, built here),
  which the real pynvml loads as it loads libnvidia-ml.so.1: an XID 79 event, then the GPU off
  the bus, read by the real exporter; a healthy stretch first names nothing;
- a model whose output turns NaN (tests/nan_model.py, patched into torchrun's workers by a
  sitecustomize) and a slow disk under one rank's checkpoint writes (tests/slow_writes.c, an
  LD_PRELOAD shim below torch.distributed.checkpoint): one real 2-rank job names both.

The engine watches with a shorter evidence window than the shipped one (EVIDENCE_S): how long
evidence must last is tested elsewhere; here, what the faults are called and where.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from diagnose_job import REPO, faulty_job, named, stepping
from support import free_port

from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.scrape.sources.targets import TargetsSource

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
EVIDENCE_S = 2.0
REFRESH_S = 0.5
GCC = shutil.which("gcc")


def build(source: str, out: Path, *libs: str) -> Path:
    if GCC is None:
        pytest.skip("needs gcc to build the stand-in library")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([GCC, "-shared", "-fPIC", "-O1", "-o", str(out), str(HERE / source), *libs],
                   check=True, capture_output=True, timeout=60)
    return out


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def watch(source: TargetsSource, span_s: float, until, seconds: float, what: str):
    """Refresh every REFRESH_S, feeding a Diagnoser, until ``until(snap, verdict)`` holds; the
    findings seen on the way."""
    diagnoser = Diagnoser(source, 2.0, span_s=span_s)
    seen: list = []
    deadline = time.monotonic() + seconds
    while True:
        snap = source.fetch()
        verdict = diagnoser.update(snap)
        seen.append(verdict.findings)
        if until(snap, verdict):
            return snap, verdict, seen
        assert time.monotonic() < deadline, f"{what}: not within {seconds}s: {verdict.findings}"
        time.sleep(REFRESH_S)


def test_a_gpu_fault_read_through_a_stand_in_nvml_library(tmp_path):
    """The driver's library is replaced, not pynvml nor the exporter: the XID arrives as an
    NVML event, the loss as NVML_ERROR_GPU_IS_LOST on every device call."""
    lib = build("fake_libnvml.c", tmp_path / "lib" / "libnvidia-ml.so.1")
    faults = tmp_path / "faults"
    faults.mkdir()
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "FAKE_NVML_DIR": str(faults),
           "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / "exporter.log", "w") as log:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(port),
             "--listen-address", "127.0.0.1", "--interval", "0.5", "--node-name", "fake-node"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    source = TargetsSource([url], timeout_s=2.0)
    try:
        def gpu_up(snap, _verdict) -> bool:
            return [(g.gpu, g.up, g.uuid) for g in snap.gpus] == [
                ("0", True, "GPU-fa4e11b0-0000-4000-8000-000000000000")]

        watch(source, EVIDENCE_S, gpu_up, 60, "the stand-in GPU served")
        text = scrape(url)
        assert 'fsdpmon_nvml_up{node="fake-node"} 1.0' in text, text[:2000]
        assert "fsdpmon_gpu_utilization_ratio{" in text and "} 0.93" in text, text[:2000]
        # healthy for a whole evidence window: nothing named
        t0 = time.monotonic()
        _, _, healthy = watch(source, EVIDENCE_S,
                              lambda s, v: time.monotonic() - t0 > 2 * EVIDENCE_S, 60, "")
        assert not any(healthy), healthy

        (faults / "xid").write_text("79")
        _, verdict, _ = watch(source, EVIDENCE_S,
                              lambda s, v: named(v.findings, "gpu_xid", gpu="0"), 30, "XID 79")
        xid = named(verdict.findings, "gpu_xid", gpu="0")
        assert (xid.node, xid.severity) == ("fake-node", "critical"), xid
        assert "XID 79" in xid.summary, xid.summary

        (faults / "lost").write_text("")
        snap, verdict, _ = watch(source, EVIDENCE_S,
                                 lambda s, v: named(v.findings, "gpu_lost", gpu="0"), 30,
                                 "the GPU lost")
        lost = named(verdict.findings, "gpu_lost", gpu="0")
        assert (lost.node, lost.severity) == ("fake-node", "critical"), lost
        assert [(g.gpu, g.up) for g in snap.gpus] == [("0", False)], snap.gpus
        assert 'xid="79"' in scrape(url), "the lost GPU keeps its XID count"
    finally:
        source.close()
        exporter.terminate()
        try:
            exporter.wait(10)  # a SIGTERM must end it (fsdpmon.signals.WAKE_S: in half a second)
        except subprocess.TimeoutExpired:
            exporter.kill()  # fail, but leave nothing behind
            exporter.wait()
            raise


# Rank 0's model output turns NaN from this forward on (after the first slow saves); rank 1's
# disk is the slow one: rank 0 commits each checkpoint, so its own save work is the longest
# when every disk is alike, and rank 1 is named only if its writes are what the others wait for.
NAN_RANK, SLOW_RANK = 0, 1
NAN_FROM_CALL = 20
CKPT_EVERY = 5
SLOW_BYTES_PER_S = 1e6  # a rank's shard of the tiny model's state is ~1 MB: ~1 s a save


def test_a_model_gone_nan_and_a_slow_disk_are_named(tmp_path):
    shim = build("slow_writes.c", tmp_path / "lib" / "slow_writes.so", "-ldl")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import nan_model\nnan_model.install()\n")
    ckpt = tmp_path / "ckpt"
    env = {"PYTHONPATH": f"{site}:{HERE}:{REPO}", "LD_PRELOAD": str(shim),
           "SLOW_WRITES_DIR": str(ckpt), "SLOW_WRITES_RANK": str(SLOW_RANK),
           "SLOW_WRITES_BYTES_PER_S": str(SLOW_BYTES_PER_S),
           "NAN_MODEL_RANK": str(NAN_RANK), "NAN_MODEL_FROM_CALL": str(NAN_FROM_CALL)}
    extra = ("--checkpoint-every", str(CKPT_EVERY), "--checkpoint-dir", str(ckpt))
    started = time.monotonic()
    with faulty_job(tmp_path, 2, extra=extra, env_extra=env) as job:
        job.wait("both ranks stepping", stepping(2))
        print(f"stepping after {time.monotonic() - started:.1f}s")
        source = TargetsSource(job.urls[:1], timeout_s=2.0)  # the training pod (no exporter)
        try:
            def both(_snap, verdict) -> bool:
                return bool(named(verdict.findings, "loss_nonfinite")
                            and named(verdict.findings, "checkpoint_slow", SLOW_RANK))

            snap, verdict, _ = watch(source, EVIDENCE_S, both, 90, "NaN loss and slow saves")
            print(f"named after {time.monotonic() - started:.1f}s, step "
                  f"{max(r.step or 0 for r in snap.ranks)}")
        finally:
            source.close()
    nan = named(verdict.findings, "loss_nonfinite")
    assert nan.severity == "critical" and str(NAN_RANK) in nan.summary, nan
    rows = {r.rank: r for r in snap.ranks}
    assert rows[NAN_RANK].loss_nonfinite, rows[NAN_RANK]
    slow = named(verdict.findings, "checkpoint_slow", SLOW_RANK)
    assert any(f"waited for rank {SLOW_RANK}" in e for e in slow.evidence), slow.evidence
    own = {r: rows[r].checkpoint_own_seconds or 0.0 for r in (0, 1)}
    assert own[SLOW_RANK] > own[NAN_RANK], f"own save work {own}: rank {SLOW_RANK}'s disk is slow"
