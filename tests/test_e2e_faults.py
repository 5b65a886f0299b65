"""End to end, faults injected for real: one 2-rank CPU training run (torchrun, gloo), the
exporter with 2 simulated GPUs, Debian's Prometheus with the shipped rules, `fsdpmon top`.

Injected (the one fault grammar, fsdpmon.faultspec):
- exporter: GPU 1 thermally throttled from the start; one XID 79 on GPU 0 a while in;
- trainer: loss +Inf on rank 0 and -Inf on rank 1 from step 1 (the case that crashed top);
  rank 1 hangs in its data loader at step ``HANG_AT``.
Checked, each against its healthy counterpart in the same run:
- the throttled GPU's clock-event series (reason and accumulated time) and the rank whose
  process holds it (NVML's process list + the worker's RANK), in the exposition and in top's
  snapshot, and in the job overview's Diagnosis table as Prometheus evaluates it; GPU 0 shows
  no slowdown reason and no throttle time;
- FsdpmonGPUXidErrors fires on the first XID 79 (a series born at 1), and not before it;
- /stacks before the hang: nobody stalled, no frames; after: rank 1's frames are in the data
  loader, rank 0's in a collective, and rank 0 entered one collective more than rank 1 did;
- `top --once --json` over both endpoints exits without a traceback, the losses non-finite.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from prometheus_stack import PROMETHEUS, free_port, prometheus, wait_for
from trainer_launch import child_env, launched, torchrun_args

from fsdpmon.conventions import GPU_THROTTLE_REASONS
from fsdpmon.dashboards.build import all_dashboards
from fsdpmon.dashboards.generate import rules_yaml
from fsdpmon.dashboards.panels import substitute

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not os.access(PROMETHEUS, os.X_OK), reason="Debian prometheus missing"),
]

JOB = "e2e-faults"
NODE = "e2e-faults-node"
HANG_AT = 12
XID_AFTER_S = 12.0  # after the exporter starts: Prometheus scrapes it by then
STALL_FLOOR_S = 4
SLOWDOWN = {"hw_slowdown", "hw_thermal_slowdown"}
THROTTLED_PANEL = next(p for p in all_dashboards()["fsdpmon-job-overview.json"]["panels"]
                       if p["title"] == "Throttled GPUs and the ranks they serve")
EXPORTER_FAULTS = f"gpu-throttle:gpu=1,after=0,reason=thermal;xid:gpu=0,code=79,after={XID_AFTER_S}"
TRAINER_FAULTS = (f"nonfinite-loss:rank=0,from_step=1,value=inf;"
                  f"nonfinite-loss:rank=1,from_step=1,value=-inf;"
                  f"hang:rank=1,at_step={HANG_AT},where=data")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def _series(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        block, value = line[len(name) + 1:].rsplit("} ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', block))
        if all(found.get(k) == v for k, v in labels.items()):
            out.append((found, float(value)))
    return out


def _worker_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """LOCAL_RANK -> pid of torchrun's worker processes."""
    out = {}
    for proc in psutil.Process(launcher.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            local = proc.environ().get("LOCAL_RANK")
            if local is not None and "fsdpmon.trainer.train" in " ".join(proc.cmdline()):
                out[int(local)] = proc.pid
    return out


@pytest.fixture
def faulty_run(tmp_path):
    train_port, exporter_port = free_port(), free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml())  # the shipped rules: XID alerts have no `for`
    env = child_env(FSDPMON_LISTEN_ADDRESS="127.0.0.1", FSDPMON_STATE_DIR=str(tmp_path / "st"),
                    FSDPMON_STALL_FLOOR_SECONDS=str(STALL_FLOOR_S), NODE_NAME=NODE)
    trainer = ["-m", "fsdpmon.trainer.train", "--model", "tiny", "--max-steps", "100000",
               "--batch-size", "2", "--seq-len", "32", "--log-every", "1",
               "--metrics-port", str(train_port), "--job-name", JOB, "--fault", TRAINER_FAULTS]
    exporter = [sys.executable, "-m", "fsdpmon.cli", "exporter", "--port", str(exporter_port),
                "--listen-address", "127.0.0.1", "--interval", "1", "--simulate-gpus", "2",
                "--node-name", NODE, "--fault", EXPORTER_FAULTS]
    with contextlib.ExitStack() as stack:
        launcher = stack.enter_context(launched(torchrun_args(2, trainer), env,
                                                tmp_path / "train.log"))
        stack.enter_context(launched(exporter, env, tmp_path / "exporter.log"))
        started = time.monotonic()
        prom = stack.enter_context(prometheus(
            tmp_path, {"fsdpmon-train": f"127.0.0.1:{train_port}",
                       "fsdpmon-exporter": f"127.0.0.1:{exporter_port}"}, rules,
            f"http://127.0.0.1:{free_port()}"))  # no Alertmanager: alerts are read in Prometheus
        yield {"launcher": launcher, "prom": prom, "started": started, "logs": tmp_path,
               "train": f"http://127.0.0.1:{train_port}", "exporter":
               f"http://127.0.0.1:{exporter_port}"}


def test_gpu_faults_hang_and_nonfinite_losses_are_named(faulty_run):
    run, prom = faulty_run, faulty_run["prom"]
    logs = run["logs"]
    marks: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        marks.append((what, round(time.monotonic() - run["started"], 1)))

    def log_tail() -> str:
        return "".join((logs / f).read_text()[-1500:] for f in ("train.log", "exporter.log"))

    # -- before the hang: both ranks step; nobody is stalled, no stack is published ------------
    wait_for(f"both ranks past step 3 ({log_tail()})", lambda: len(_series(
        _get(run["train"] + "/metrics"), "fsdpmon_train_step")) == 2 and min(
        v for _, v in _series(_get(run["train"] + "/metrics"), "fsdpmon_train_step")) >= 3,
        timeout=150)
    mark("ranks stepping")
    before = json.loads(_get(run["train"] + "/stacks"))
    assert before["job"] == JOB and len(before["ranks"]) == 2, before
    assert not any(r["stalled"] or r["frames"] for r in before["ranks"]), before

    # -- the throttled GPU and the rank whose process holds it --------------------------------
    workers = _worker_pids(run["launcher"])
    assert set(workers) == {0, 1}, workers

    def tied() -> str | None:
        # Other training processes on this host (other jobs) hold simulated GPUs too, as on a
        # shared node: ours must be on their own GPU and on no other.
        text = _get(run["exporter"] + "/metrics")
        held: dict[str, set[str]] = {}
        for g, _ in _series(text, "fsdpmon_gpu_process_memory_used_bytes"):
            held.setdefault(g["gpu"], set()).add(g["pid"])
        seen[:] = [held]
        ok = all(str(pid) in held.get(str(local), ()) and
                 str(pid) not in held.get(str(1 - local), ()) for local, pid in workers.items())
        return text if ok else None

    seen: list = []
    try:
        text = wait_for("each simulated GPU held by its worker", tied, timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}: workers {workers}, GPU holders {seen}") from None
    mark("GPUs tied to ranks")
    for rank, pid in workers.items():
        info = _series(text, "fsdpmon_process_info", pid=str(pid))
        assert info and info[0][0]["rank"] == str(rank) and info[0][0]["local_rank"] == str(rank)
    active = {g["gpu"]: {g2["reason"] for g2, v in _series(
        text, "fsdpmon_gpu_clock_event_active", gpu=g["gpu"]) if v == 1} for g, _ in
        _series(text, "fsdpmon_gpu_up")}
    assert active["1"] >= SLOWDOWN, f"GPU 1 active reasons: {active['1']}"
    assert not active["0"] & SLOWDOWN, f"healthy GPU 0 shows {active['0'] & SLOWDOWN}"
    throttled_s = {g["gpu"]: v for g, v in _series(
        text, "fsdpmon_gpu_clock_event_seconds_total", reason="hw_thermal_slowdown")}
    elapsed = time.monotonic() - run["started"]
    assert 0 < throttled_s["1"] <= elapsed, f"GPU 1 throttled {throttled_s['1']}s of {elapsed}s"
    assert throttled_s["0"] == 0, f"healthy GPU 0 throttled {throttled_s['0']}s"
    clocks = {g["gpu"]: v for g, v in _series(text, "fsdpmon_gpu_sm_clock_hertz")}
    peak = {g["gpu"]: v for g, v in _series(text, "fsdpmon_gpu_sm_clock_max_hertz")}
    assert clocks["1"] <= 0.5 * peak["1"] < clocks["0"], f"SM clocks {clocks}, max {peak}"

    # -- the job overview's Diagnosis table, evaluated by Prometheus: GPU 1 throttled, rank 1 ---
    query = substitute(THROTTLED_PANEL["targets"][0]["expr"], {"namespace": ".*"})

    def throttled_rows() -> dict | None:
        rows = {(s["metric"]["gpu"], s["metric"]["rank"]): float(s["value"][1])
                for s in prom.query(query) if s["metric"]["node"] == NODE}
        return rows if rows.get(("1", "1"), 0) >= 1 and ("0", "0") in rows else None

    rows = wait_for("the Diagnosis table naming GPU 1 throttled under rank 1", throttled_rows,
                    timeout=20)
    # Other jobs' workers on this host hold the simulated GPUs too (by LOCAL_RANK): a GPU may
    # list several ranks; ours must be there, and GPU 0 is throttled for nobody.
    expected = len(active["1"] & set(GPU_THROTTLE_REASONS))  # what the exporter serves
    assert rows[("1", "1")] == expected >= len(SLOWDOWN), f"{rows}: GPU 1 has {active['1']}"
    assert not {k: v for k, v in rows.items() if k[0] == "0" and v}, rows
    mark("Diagnosis table")

    # -- the first XID 79: an alert on it, and none before it --------------------------------
    fired = wait_for("FsdpmonGPUXidErrors on the first XID 79",
                     lambda: prom.alerts("FsdpmonGPUXidErrors"), timeout=XID_AFTER_S + 30)
    mark("XID alert")
    # Once it fired, Prometheus's own history says when each series was born (evaluated every
    # second): the exporter's GPUs before the XID, the XID's series, then the alert (ALERTS).
    since = time.time() - (time.monotonic() - run["started"]) - 60

    def births() -> dict[str, float | None] | None:
        now = time.time()  # the range's 1 s grid can miss the newest second: ask again
        born = {what: prom.first_time(expr, since, now) for what, expr in (
            ("gpus", f'fsdpmon_gpu_up{{node="{NODE}",gpu="0"}}'),
            ("xid", 'fsdpmon_gpu_xid_errors_total{xid="79"}'),
            ("alert", 'ALERTS{alertname="FsdpmonGPUXidErrors"}'))}
        return born if None not in born.values() else None

    born = wait_for("the XID and its alert in Prometheus's history", births, timeout=30)
    assert born["gpus"] + 2 <= born["xid"], (
        f"the exporter's GPUs were first evaluated {born['xid'] - born['gpus']:.0f}s before "
        f"the XID: no healthy evaluation to speak of (raise XID_AFTER_S): {born}")
    assert born["alert"] >= born["xid"], f"XID alert before any XID: {born}"
    labels = fired[0]["labels"]
    assert (labels["gpu"], labels["xid"], labels["node"]) == ("0", "79", NODE), labels
    count = prom.query('fsdpmon_gpu_xid_errors_total{xid="79"}')
    assert [float(s["value"][1]) for s in count] == [1.0], count  # born at 1: the first event
    assert not [a for a in prom.alerts("FsdpmonGPUXidErrors") if a["labels"]["gpu"] == "1"]

    # -- the hang: rank 1 in its data loader, rank 0 waiting in a collective -------------------
    def both_stalled() -> dict | None:
        doc = json.loads(_get(run["train"] + "/stacks"))
        return doc if all(r["stalled"] and r["frames"] for r in doc["ranks"]) else None

    doc = wait_for(f"both ranks' stacks published ({log_tail()})", both_stalled, timeout=90)
    mark("stacks")
    ranks = {r["rank"]: r for r in doc["ranks"]}
    hung, waiting = ranks[1], ranks[0]
    hung_functions = [f["function"] for f in hung["frames"]]
    assert "hang_in_data_loader" in hung_functions and "__next__" in hung_functions, hung_functions
    assert hung["phase"] == "data" and hung["step"] == HANG_AT, (hung["phase"], hung["step"])
    in_collective = [f for f in waiting["frames"] if "torch/distributed" in f["file"]]
    assert in_collective, [f"{f['file']}:{f['function']}" for f in waiting["frames"]]
    assert "hang_in_data_loader" not in [f["function"] for f in waiting["frames"]]
    assert waiting["last_collective"] and hung["last_collective"], doc
    assert waiting["last_collective"]["seq"] > hung["last_collective"]["seq"], (
        f"rank 0 entered collective #{waiting['last_collective']['seq']}, rank 1 stopped at "
        f"#{hung['last_collective']['seq']}: the hung rank is the one behind")

    # -- top reads the non-finite losses, the tie and the throttle without breaking ------------
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", "--json", "--targets",
                           f"{run['train']}/metrics,{run['exporter']}/metrics"],
                          capture_output=True, text=True, timeout=60, env=child_env())
    assert "Traceback" not in done.stderr, done.stderr
    snap = json.loads(done.stdout)
    by_rank = {r["rank"]: r for r in snap["ranks"]}
    assert by_rank[0]["loss_nonfinite"] and by_rank[1]["loss_nonfinite"], by_rank
    assert [by_rank[0]["loss"], by_rank[1]["loss"]] == [None, None]  # strict JSON: null
    gpus = {g["gpu"]: g for g in snap["gpus"]}
    assert 1 in gpus["1"]["ranks"] and 0 in gpus["0"]["ranks"], gpus  # (+ other jobs' ranks)
    assert 1 not in gpus["0"]["ranks"] and 0 not in gpus["1"]["ranks"], gpus
    assert set(gpus["1"]["clock_events"]) >= SLOWDOWN and not SLOWDOWN & set(
        gpus["0"]["clock_events"])
    assert by_rank[1]["gpus"] == [f"{NODE}/1"], by_rank[1]
    causes = {f["cause"] for f in snap["findings"]}
    assert {"loss_nonfinite", "hang"} <= causes, causes
    assert done.returncode == 4, (done.returncode, done.stderr)  # critical findings stand
    mark("top")
    print("phases (s since the exporter started):", marks)  # shown with -s
