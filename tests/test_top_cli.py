"""`fsdpmon top --once/--json`: output and the documented exit status, as scripts use it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from payload_server import PayloadServer
from synthetic_job import RankSpec, job_expositions, training_exposition


def top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def server():
    srv = PayloadServer(job_expositions("llama", 1, 2))
    stalled = [RankSpec(rank=0, local_rank=0), RankSpec(rank=1, local_rank=1, stalled=True)]
    srv.payloads["/stalled"] = training_exposition("llama", stalled)
    yield srv
    srv.close()


def test_healthy_once_prints_a_frame_and_exits_0(server):
    out = top("--targets", f"{server.url('/train/node-000')},{server.url('/node/node-000')}",
              "--once")
    assert out.returncode == 0, out.stderr
    assert "RUNNING" in out.stdout and "Ranks" in out.stdout and "GPUs" in out.stdout


def test_json_snapshot(server):
    out = top("--targets", server.url("/train/node-000"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["state"] == "RUNNING" and len(data["ranks"]) == 2


def test_stalled_exits_4(server):
    out = top("--targets", server.url("/stalled"), "--once")
    assert out.returncode == 4
    assert out.stderr.strip() == "fsdpmon top: error: job llama is STALLED (rank 1)"


def test_unreachable_exits_3_and_partly_down_exits_4(server):
    out = top("--targets", "127.0.0.1:1", "--json", "--timeout", "1")
    assert out.returncode == 3 and "no target answered" in out.stderr
    assert json.loads(out.stdout)["state"] == "DOWN"
    out = top("--targets", f"{server.url('/train/node-000')},127.0.0.1:1", "--once")
    assert out.returncode == 4 and "1 of 2 targets down" in out.stderr


def test_bad_flags_are_one_line_errors():
    for args, field in ((["--targets", "ftp://x"], "--targets"), (["--once"], "--targets"),
                        (["--targets", "h:1", "--interval", "0"], "--interval"),
                        (["--targets", "h:1", "--selector", "a=b"], "--selector")):
        out = top(*args)
        assert out.returncode == 2, args
        assert out.stderr.startswith(f"fsdpmon top: error: {field}")
        assert "Traceback" not in out.stderr


def test_help_documents_exit_status():
    out = top("--help")
    assert out.returncode == 0
    assert "exit status" in out.stdout and "4  the job is unhealthy" in out.stdout
