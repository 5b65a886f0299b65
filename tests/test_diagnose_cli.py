"""`fsdpmon diagnose` as a user runs it, against stand-in pods serving catalog-shaped metrics
(and `/stacks`): the right verdict and exit status, JSON shape, bad flags, `--help`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from payload_server import PayloadServer
from support import free_port
from synthetic_job import GpuSpec, exporter_exposition, training_exposition
from top_snapshots import JOB, REFRESH_S, diagnosis_history, ranks

from fsdpmon.cli import main
from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD
from fsdpmon.diagnose import cli as diagnose_cli

# quiet: its processes mostly wait (19.1 s, 4.8 s alone, /usr/bin/time, 2-core VM)
pytestmark = pytest.mark.quiet

WATCH = f"{DIAGNOSIS_EVIDENCE_SECONDS + 1.5:g}s"  # one window of evidence and a refresh more


def payloads(specs, gpu: dict | None = None, stacks: dict | None = None) -> dict[str, bytes]:
    """Two pods of two ranks: /pod-N/metrics (+ /pod-N/stacks) and /node-N/metrics."""
    out = {}
    for n in range(2):
        mine = [s for s in specs if s.node == f"node-{n}"]
        out[f"/pod-{n}/metrics"] = training_exposition(JOB, mine, specs)
        gpus = [GpuSpec(gpu=s.local_rank, pod=f"{JOB}-worker-{n}", pid=4000 + s.rank,
                        **(gpu or {}).get((n, s.local_rank), {})) for s in mine]
        out[f"/node-{n}/metrics"] = exporter_exposition(f"node-{n}", gpus)
        if stacks is not None:
            out[f"/pod-{n}/stacks"] = json.dumps(stacks[n]).encode()
    return out


def diagnose(server: PayloadServer, *args: str) -> subprocess.Popen:
    urls = ",".join(server.url(f"/{kind}-{n}/metrics") for n in range(2)
                    for kind in ("pod", "node"))
    return subprocess.Popen([sys.executable, "-m", "fsdpmon.cli", "diagnose", "--targets", urls,
                             "--interval", "0.5", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _rank_stack(rank: int, seq: int, where: str) -> dict:
    return {"rank": rank, "local_rank": rank % 2, "pid": 100 + rank, "step": 40, "phase": "x",
            "stalled": True, "published_at": 0, "last_collective": {"op": "all_gather",
                                                                   "seq": seq},
            "frames": [{"file": "train.py", "line": 1, "function": "main"},
                       {"file": where, "line": 7, "function": "wait"}]}


STALL = {"stalled": True, "heartbeat_age_s": 90.0}
CASES = {
    "healthy": (ranks(), None, None),
    "straggler": (ranks(r3={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.8}), None, None),
    "throttled": (ranks(r1={"straggler_score": STRAGGLER_SCORE_THRESHOLD * 0.8}),
                  {(0, 1): {"clock_events": ("hw_power_brake_slowdown",)}}, None),
    "hang": (ranks(**{f"r{r}": STALL for r in range(4)}), None,
             [{"job": JOB, "ranks": [_rank_stack(0, 9, "fsdp.py"), _rank_stack(1, 9, "fsdp.py")]},
              {"job": JOB, "ranks": [_rank_stack(2, 8, "data.py"), _rank_stack(3, 9, "fsdp.py")]}]),
}


@pytest.mark.slow
def test_verdicts_and_exit_status():
    """Every case watched at once (each needs the full evidence window)."""
    servers = {name: PayloadServer(payloads(specs, gpu, stacks))
               for name, (specs, gpu, stacks) in CASES.items()}
    try:
        procs = {name: diagnose(s, "--json", "--for", WATCH) for name, s in servers.items()}
        text = diagnose(servers["hang"], "--for", WATCH)
        out = {name: (p.communicate(timeout=60), p.returncode) for name, p in procs.items()}
        (text_out, text_err), text_rc = text.communicate(timeout=60), text.returncode
    finally:
        for s in servers.values():
            s.close()
    docs = {name: json.loads(stdout) for name, ((stdout, _), _) in out.items()}
    got = {name: [(f["cause"], f["rank"], f["gpu"]) for f in d["findings"]]
           for name, d in docs.items()}
    assert got == {"healthy": [], "straggler": [("straggler_compute", 3, "1")],
                   "throttled": [("gpu_throttled", 1, "1")], "hang": [("hang", 2, "0")]}, got
    # the healthy verdict is one: drawn from a whole evidence window, not an empty history
    assert docs["healthy"]["evidence_seconds"] >= DIAGNOSIS_EVIDENCE_SECONDS, docs["healthy"]
    assert {name: rc for name, (_, rc) in out.items()} == {
        "healthy": 0, "straggler": 0, "throttled": 0, "hang": 4}, out
    hang = docs["hang"]["findings"][0]
    assert set(hang) >= {"cause", "severity", "rank", "pod", "node", "gpu", "evidence",
                         "next_step"} and isinstance(docs["hang"]["time"], float)
    assert [c["ranks"] for c in hang["stacks"]] == [[2], [0, 1, 3]], hang["stacks"]
    assert text_rc == 4 and "CRITICAL hang" in text_out and "data.py:7 wait" in text_out, (
        text_out, text_err)
    assert text_err.strip().startswith("fsdpmon diagnose: error: hang:"), text_err


class HistorySource:
    """A source that hands out a built history, one snapshot a refresh (then the last again,
    which the diagnosis skips as the same refresh)."""

    def __init__(self, snaps: list) -> None:
        self.snaps, self.fetches = snaps, 0

    def fetch(self):
        self.fetches += 1
        return self.snaps[min(self.fetches, len(self.snaps)) - 1]

    def close(self) -> None:
        pass


# The documented exit status (the command's epilog): 0 with warnings only, 4 with a critical
# finding. XID 13 is the application's own fault, XID 79 a GPU off the bus (DESIGN.md).
@pytest.mark.parametrize("code, exit_status", [(13, 0), (79, 4)])
def test_an_xid_exits_critical_only_when_the_node_needs_draining(monkeypatch, capsys, code,
                                                                 exit_status):
    n = int(DIAGNOSIS_EVIDENCE_SECONDS // REFRESH_S) + 2  # a whole evidence window and more
    source = HistorySource(diagnosis_history(
        lambda i: {"gpu": {(1, 0): {"xids": ((code, 1),) if i >= 2 else ()}}}, n))
    monkeypatch.setattr(diagnose_cli, "build_source", lambda args: source)
    status = main(["diagnose", "--targets", "unused:1", "--for", "1", "--interval", "0.01"])
    out, err = capsys.readouterr()
    assert source.fetches >= n, f"only {source.fetches} of {n} refreshes in the watch"
    assert f"XID {code}" in out, out
    assert status == exit_status, (status, out, err)


def test_bad_flags_are_one_line_errors(capsys):
    for args, field in ((["--targets", "x:1", "--for", "soon"], "--for"),
                        (["--targets", "x:1", "--interval", "0"], "--interval"),
                        ([], "--targets")):
        assert main(["diagnose", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and field in err, err


def test_unreachable_exits_3(capsys):
    assert main(["diagnose", "--targets", f"127.0.0.1:{free_port()}", "--for", "0",
                 "--timeout", "0.5"]) == 3
    assert "no target answered" in capsys.readouterr().err


def test_help_says_how_long_a_verdict_takes(capsys):
    with pytest.raises(SystemExit) as done:
        main(["diagnose", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert "how long a verdict takes" in out and f"{DIAGNOSIS_EVIDENCE_SECONDS:.0f} s" in out
