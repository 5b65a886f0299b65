"""`fsdpmon top --once/--json`: output and the documented exit status, as scripts use it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from payload_server import PayloadServer
from rich.console import Group
from synthetic_job import RankSpec, job_expositions, training_exposition
from test_views import render
from top_snapshots import ranks, snapshot

from fsdpmon.conventions import Severity
from fsdpmon.diagnose import Finding, Verdict, judge
from fsdpmon.errors import JobUnhealthyError, UnreachableError
from fsdpmon.job.snapshot import JobState
from fsdpmon.top.cli import check_health
from fsdpmon.top.views import header_lines


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
    assert data["state"] == "RUNNING" and len(data["ranks"]) == 2 and data["findings"] == []


def test_stalled_exits_4(server):
    out = top("--targets", server.url("/stalled"), "--once")
    assert out.returncode == 4
    assert out.stderr.strip() == ("fsdpmon top: error: job llama is STALLED (hang: rank 1 "
                                  "stalled: no step within the threshold)")


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


# -- the header and the exit status follow the findings, and nothing else -------------------

LOST = Finding("gpu_lost", Severity.CRITICAL, "GPU lost: node-1/1", node="node-1", gpu="1")
HANG = Finding("hang", Severity.CRITICAL, "rank 2 holds up 3 ranks", rank=2)
SLOW = Finding("straggler_compute", Severity.WARNING, "rank 3 straggles: its own compute is slow",
               rank=3)


def _alert_lines(snap, verdict) -> list[str]:
    text = render(Group(*header_lines(snap, verdict)), 120)
    return [line.rstrip() for line in text.split("\n") if line.startswith("!")]


def test_the_header_says_what_the_findings_say():
    stalled = snapshot(ranks(r1={"stalled": True}))
    assert stalled.state is JobState.STALLED  # a fact of the job model: the title says it
    assert _alert_lines(stalled, Verdict()) == [], "a line no finding said"
    assert _alert_lines(stalled, judge([stalled])) == [
        "! rank 1 stalled: no step within the threshold"]
    healthy = snapshot()
    both = Verdict(findings=(HANG, SLOW), seconds=12.0, span_s=10.0, glance=(LOST,))
    assert _alert_lines(healthy, both) == [
        "! hang: rank 2 holds up 3 ranks (+1 more: 5 Diagnosis)", "! GPU lost: node-1/1"]
    many = tuple(replace(LOST, summary=f"GPU lost: node-1/{g}") for g in range(4))
    assert _alert_lines(healthy, Verdict(findings=(HANG,), glance=many)) == [
        "! hang: rank 2 holds up 3 ranks", "! GPU lost: node-1/0", "! GPU lost: node-1/1",
        "! +2 more alerts"]


def test_once_exit_status_follows_the_findings_severity():
    healthy = snapshot()
    check_health(healthy, Verdict())  # no finding: 0
    for verdict in (Verdict(glance=(LOST,)), Verdict(findings=(LOST,))):
        with pytest.raises(JobUnhealthyError) as raised:  # exit 4
            check_health(healthy, verdict)
        assert str(raised.value) == "job llama is RUNNING (gpu_lost: GPU lost: node-1/1)"
    # a GPU fault that only warns (an XID outside GPU_XID_CRITICAL)
    warned = replace(LOST, cause="gpu_xid", severity=Severity.WARNING)
    check_health(healthy, Verdict(glance=(warned, SLOW)))  # warnings only: 0
    done = replace(healthy, state=JobState.DONE)
    check_health(done, Verdict(glance=(LOST,)))  # a job that ended well: 0
    with pytest.raises(UnreachableError):  # exit 3, whatever was found
        check_health(replace(healthy, state=JobState.DOWN), Verdict())
    failed = replace(healthy, state=JobState.FAILED, reason="PyTorchJobFailed: worker-1 died")
    with pytest.raises(JobUnhealthyError, match=r"is FAILED \(PyTorchJobFailed: worker-1 died\)$"):
        check_health(failed, Verdict(glance=(LOST,)))  # the job's own word first
    with pytest.raises(JobUnhealthyError, match=r"is RESTARTING$"):
        check_health(replace(healthy, state=JobState.RESTARTING), Verdict())
