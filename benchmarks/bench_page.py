"""The page, end to end, for every fault of the matrix: which notification it sends, when, naming
whom, and whether `fsdpmon diagnose --prometheus` agrees with `fsdpmon diagnose` on the pods.

Each fault runs on a fresh job (tests/diagnose_job.py: torchrun CPU ranks of the tiny trainer,
through tests/trainer_outside_faults.py, the exporter with simulated GPUs), scraped by a real
Prometheus loaded with the generated rules and sending to a real Alertmanager running the route
`fsdpmon manifests` ships (grouped by namespace, job_name, cause), which notifies a webhook
receiver of this script. The training target carries the pod and node labels Kubernetes
discovery adds. Two ways of timing (--durations):
  fast     every rule's `for` shortened (and the stall floor 8 s, as the job's monitor is set),
           scrapes and evaluations every second, Alertmanager's timers 1 s: what the rules name;
  shipped  the rule file as shipped (its `for` durations, the culprit group's 10 s interval),
           the shipped scrape intervals, Alertmanager's shipped route (critical group_wait 5 s):
           how long a page takes (the monitor's own bounds are then the shipped ones too: the
           120 s floor, the 25 s wait floor).
Meanwhile the engine watches the job twice, as `fsdpmon diagnose` does: on the pods' endpoints
and on Prometheus (PrometheusSource), each refresh ~1 s apart.

Per fault and world size it prints: seconds from the fault starting to the first firing
notification of its cause; the culprit it names (rank, pod, node, gpu); how many notification
groups the cause got (one incident: 1); any other rank named by any notification (a waiting
rank must never be); the verdicts of diagnose on the pods and on Prometheus, and whether they
agree. Healthy runs (--healthy-seconds at --healthy-ranks, through benchmarks/healthy_trainer.py:
a 60 s first step, 30 s evaluation passes without a collective, 20 s rank-0-only pauses with the
others in a barrier, saves slowed from outside to ~30 s): notifications received (0 wanted), and
the pauses made.
Not a test: figures depend on the machine. Run:
``.venv/bin/python benchmarks/bench_page.py [--durations fast|shipped] [--ranks 2 4] [--only ...]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_blind  # noqa: E402
import bench_diagnose  # noqa: E402
from cpu_starve import QuotaUnavailable  # noqa: E402
from diagnose_job import Job, faulty_job, stepping  # noqa: E402
from prometheus_stack import Webhook, alertmanager, run_prometheus  # noqa: E402
from shipped_alerts import SHIPPED_RULES, scrape_config  # noqa: E402

from fsdpmon.dashboards.generate import rules_yaml  # noqa: E402
from fsdpmon.dashboards.rulebase import RuleBounds  # noqa: E402
from fsdpmon.diagnose.evidence import Diagnoser  # noqa: E402
from fsdpmon.manifests.alerting import alertmanager_config  # noqa: E402
from fsdpmon.scrape.sources.prometheus import PrometheusSource  # noqa: E402

JOB = "e2e-diagnose"  # the job name diagnose_job's trainer runs under
POD = "bench-pod-0"
NODE = socket.gethostname()
S = bench_diagnose.S
# Only `for` durations shortened (the stall bound is the one the ranks publish: 8 s in these jobs).
FAST = RuleBounds(stall_for="0s", missing_for="0s", straggler_for="5s",
                  cpu_throttled_for="5s", cpu_throttled_window="30s", cpu_starved_for="5s",
                  checkpoint_for="0s", nonfinite_for="0s", throttle_for="5s", gpu_lost_for="0s")
# fault -> (alert causes that page it, diagnose causes, rank, gpu); the injector's faults from
# bench_diagnose, the outside ones from bench_blind
EXPECT: dict[str, tuple[tuple[str, ...], tuple[str, ...], int | None, str | None]] = {
    "compute-slow": (("straggler_compute",), ("straggler_compute",), 1, None),
    "data-slow": (("straggler_data",), ("straggler_data",), 1, None),
    "hang (data)": (("hang",), ("hang",), 1, None),
    "hang (host)": (("hang", "rank_unresponsive"), ("hang", "rank_unresponsive"), 1, None),
    "nonfinite-loss": (("loss_nonfinite",), ("loss_nonfinite",), 1, None),
    "checkpoint-slow": (("checkpoint_slow",), ("checkpoint_slow",), 1, None),
    "crash": (("rank_missing",), ("rank_missing",), 1, None),
    "gpu-throttle": (("gpu_throttled",), ("gpu_throttled",), 1, "1"),
    "xid": (("gpu_xid",), ("gpu_xid",), 1, "1"),
    "gpu-lost": (("gpu_lost",), ("gpu_lost",), 1, "1"),
    "ecc-uncorrected": (("gpu_ecc",), ("gpu_ecc",), 1, "1"),
    "cpu-neighbours": (("host_cpu_contention",), ("host_cpu_contention",), 1, None),
    "cpu-quota": (("cpu_throttled",), ("cpu_throttled",), 1, None),
    "stop-port-holder": (("rank_unresponsive",), ("rank_unresponsive",), 0, None),
    "gil-hang": (("rank_unresponsive",), ("rank_unresponsive",), 1, None),
    "nan-logits": (("loss_nonfinite",), ("loss_nonfinite",), 1, None),
}
INJECTED = {row[0]: row for row in bench_diagnose.MATRIX}
DEADLINE_S = {"fast": 240.0, "shipped": 1500.0}


@contextlib.contextmanager
def alerting(tmp: Path, job: Job, durations: str) -> Iterator[tuple[Any, Webhook]]:
    """Alertmanager (the shipped route), its webhook and Prometheus on the job's targets."""
    training, exporter = job.urls
    if durations == "shipped":
        config = scrape_config(training, exporter)
        route = alertmanager_config()
    else:
        rules = tmp / "rules.yaml"
        rules.write_text(rules_yaml(FAST))
        config = scrape_config(training, exporter)
        config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s",
                            "evaluation_interval": "1s"}
        config["rule_files"] = [str(rules)]
        for scrape in config["scrape_configs"]:
            scrape["scrape_interval"], scrape["scrape_timeout"] = "1s", "1s"
        route = alertmanager_config(group_wait="1s", group_interval="1s", repeat_interval="1h")
    config["scrape_configs"][0]["static_configs"][0]["labels"] = {"pod": POD, "node": NODE}
    with contextlib.ExitStack() as stack:
        hook = stack.enter_context(Webhook())
        route["receivers"][0]["webhook_configs"][0]["url"] = hook.url
        am = stack.enter_context(alertmanager(tmp, hook.url, route))
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [am.removeprefix("http://")]}]}]}
        args = ["--rules.alert.resend-delay=1s"] if durations == "fast" else []
        prom = stack.enter_context(run_prometheus(tmp, config, args=args))
        yield prom, hook


def _firing(hook: Webhook, causes: tuple[str, ...]) -> list[dict]:
    return [n for n in hook.received() if n["status"] == "firing"
            and n["groupLabels"].get("cause") in causes]


def _verdict(findings, causes: tuple[str, ...], rank: int | None,
             gpu: str | None) -> tuple[str, int | None] | None:
    for f in findings:
        if f.cause in causes and (rank is None or f.rank == rank) and (gpu is None
                                                                       or f.gpu == gpu):
            return f.cause, f.rank
    return None


def run_fault(name: str, ranks: int, durations: str) -> str:
    outside = name in bench_blind.FAULTS
    train_spec, gpu_spec, extra, restarts = "", "", (), 0
    if not outside:
        _, train_spec, gpu_spec, *_ = INJECTED[name]
        restarts = bench_diagnose.RESTARTS.get(name, 0)
    else:
        train_spec = bench_blind.SPECS.get(name, "")
    after = bench_diagnose.DIAGNOSIS_EVIDENCE_SECONDS + 2
    env = dict(bench_blind.ENVS.get(name) or {})
    if durations == "shipped":
        env["FSDPMON_STALL_FLOOR_SECONDS"] = "120"
        env["FSDPMON_STALL_WAIT_FLOOR_SECONDS"] = "25"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if name == "checkpoint-slow":
            extra = ("--checkpoint-every", "20", "--checkpoint-dir", tmp_name)
        with faulty_job(tmp, ranks, train_spec, extra, restarts, entry=bench_blind.ENTRY,
                        env_extra=env) as job, alerting(tmp, job, durations) as (prom, hook):
            job.wait("stepping", stepping(ranks), 300)
            job.start_exporter(gpu_spec.format(after=after))
            with contextlib.ExitStack() as fault:
                fault_at = None
                if outside and bench_blind.FAULTS[name][2] is not None:
                    try:
                        fault.enter_context(bench_blind.FAULTS[name][2](
                            job, bench_blind.workers(job)))
                    except QuotaUnavailable as why:
                        return f"{name:<17} {ranks}  skipped: {why}"
                    fault_at = time.monotonic()
                return _watch(job, prom, hook, name, durations, fault_at, after)


def _started(job: Job, name: str, after: float):
    if name in INJECTED:
        _, _, gpu_spec, *_ = INJECTED[name]
        return bench_diagnose._fault_started(job, name, gpu_spec, after)
    return lambda snap: any((r.step or 0) >= S for r in snap.ranks)


def _watch(job: Job, prom, hook: Webhook, name: str, durations: str, fault_at: float | None,
           after: float) -> str:
    alert_causes, causes, rank, gpu = EXPECT[name]
    big_source = PrometheusSource(prom.url, job_name=JOB, timeout_s=10)
    big = Diagnoser(big_source, 2.0)
    started = _started(job, name, after)
    direct_at = prom_at = notified_at = None
    direct = by_prom = None
    deadline = time.monotonic() + 300 + DEADLINE_S[durations]
    try:
        while time.monotonic() < deadline:
            snap, verdict = job.refresh()
            with contextlib.suppress(OSError, ValueError):
                pv = big.update(big_source.fetch())
                found = _verdict(pv.findings, causes, rank, gpu)
                if fault_at is not None and found and prom_at is None:
                    prom_at, by_prom = time.monotonic() - fault_at, found
            now = time.monotonic()
            if fault_at is None and started(snap):
                fault_at, deadline = now, now + DEADLINE_S[durations]
            found = _verdict(verdict.findings, causes, rank, gpu)
            if fault_at is not None and found and direct_at is None:
                direct_at, direct = now - fault_at, found
            if fault_at is not None and notified_at is None and _firing(hook, alert_causes):
                notified_at = now - fault_at
            paged = notified_at is not None or not alert_causes
            if fault_at is not None and paged and direct_at is not None and prom_at is not None:
                time.sleep(3 if durations == "fast" else 35)  # what follows within a group wait
                break
            time.sleep(0.5)
    finally:
        big_source.close()
    return _line(name, job, hook, alert_causes, rank, notified_at, direct, direct_at, by_prom,
                 prom_at)


def _line(name, job, hook, alert_causes, rank, notified_at, direct, direct_at, by_prom,
          prom_at) -> str:
    ranks = len(job.source.fetch().ranks) or "?"
    firing = _firing(hook, alert_causes)
    groups = {n["groupKey"] for n in firing}
    named = [a["labels"] for n in firing for a in n["alerts"] if a["status"] == "firing"]
    culprits = sorted({(a.get("rank", "-"), a.get("pod", "-"), a.get("node", "-"),
                        a.get("gpu", "-")) for a in named})
    others = sorted({a["labels"]["rank"] for n in hook.received() for a in n["alerts"]
                     if a["status"] == "firing" and a["labels"].get("rank")
                     and a["labels"]["rank"] != str(rank)})
    every = sorted({(n["groupLabels"].get("cause"), a["labels"].get("alertname"))
                    for n in hook.received() for a in n["alerts"]})
    page = (f"{notified_at:6.1f}s" if notified_at is not None else
            ("no alert" if not alert_causes else "  NONE"))
    agree = direct is not None and by_prom is not None and direct == by_prom
    return (f"{name:<17} {ranks:>2}  page {page}  groups {len(groups)}  culprit "
            f"{culprits or '-'}  other ranks named {others or 'none'}  | diagnose pods "
            f"{_said(direct, direct_at)}  prometheus {_said(by_prom, prom_at)}  "
            f"{'agree' if agree else 'DIFFER'}  | all notifications {every}")


def _said(found, at) -> str:
    return f"{found[0]}(rank {found[1]}) {at:.0f}s" if found else "NOTHING"


# The healthy job's pauses (benchmarks/healthy_trainer.py): a 60 s first step, evaluation
# passes of 30 s without a collective, rank-0-only pauses of 20 s with the others in a barrier,
# and saves slowed from outside to ~30 s (rank 1's writes, through tests/slow_writes.c: the
# tiny model's shard is ~1 MB). Steps take ~0.3 s here, so each comes every few minutes.
PAUSES = "first=60,pace=0.2,eval_every=700,eval=30,export_every=450,export=20"
SAVE_EVERY = "500"
SLOW_SAVE_BYTES_PER_S = "35000"


def _slow_writes(tmp: Path) -> Path:
    shim = tmp / "slow_writes.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim),
                    str(HERE.parent / "tests" / "slow_writes.c"), "-ldl"], check=True)
    return shim


def healthy(ranks: int, seconds: float, durations: str) -> str:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ckpt = tmp / "ckpt"
        env = {"HEALTHY_PAUSES": PAUSES, "LD_PRELOAD": str(_slow_writes(tmp)),
               "SLOW_WRITES_DIR": str(ckpt), "SLOW_WRITES_RANK": "1",
               "SLOW_WRITES_BYTES_PER_S": SLOW_SAVE_BYTES_PER_S}
        if durations == "shipped":
            env["FSDPMON_STALL_FLOOR_SECONDS"] = "120"
            env["FSDPMON_STALL_WAIT_FLOOR_SECONDS"] = "25"
        with faulty_job(tmp, ranks, "", ("--checkpoint-every", SAVE_EVERY, "--checkpoint-dir",
                                         str(ckpt)), entry=(str(HERE / "healthy_trainer.py"),),
                        env_extra=env) as job, alerting(tmp, job, durations) as (_, hook):
            job.wait("stepping", stepping(ranks), 300)
            job.start_exporter()
            begun = time.monotonic()
            while time.monotonic() - begun < seconds:
                job.refresh()
                time.sleep(1.0)
            step = max((r.step or 0) for r in job.source.fetch().ranks)
            notes = hook.received()
            return (f"healthy {ranks} ranks, {seconds:.0f} s to step {step}, "
                    f"{_pauses(tmp / 'train.log')}: {len(notes)} notifications "
                    f"{sorted({a['labels'].get('alertname') for n in notes for a in n['alerts']})}")


def _pauses(log: Path) -> str:
    """What the healthy trainer printed: how many pauses of each kind, and the saves' times."""
    kinds: dict[str, int] = {}
    saves: list[float] = []
    for line in log.read_text(errors="replace").splitlines():
        if "healthy-pause " not in line:
            continue
        words = line.split("healthy-pause ", 1)[1].split()
        kinds[words[0]] = kinds.get(words[0], 0) + 1
        if words[0] == "save" and "took" in words:
            saves.append(float(words[words.index("took") + 1]))
    took = ", ".join(f"{s:.0f}" for s in saves)
    return (f"pauses {dict(sorted(kinds.items()))}, saves took [{took}] s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--durations", choices=("fast", "shipped"), default="fast")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--only", nargs="*", choices=list(EXPECT))
    parser.add_argument("--healthy-ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--healthy-seconds", type=float, default=300.0)
    args = parser.parse_args()
    rules = (f"as shipped ({SHIPPED_RULES.name})" if args.durations == "shipped"
             else "with `for` shortened")
    print(f"{platform.node()}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; rules "
          f"{rules}", flush=True)
    for ranks in args.ranks:
        for name in args.only or list(EXPECT):
            print("  " + run_fault(name, ranks, args.durations), flush=True)
    for ranks in args.healthy_ranks:
        print("  " + healthy(ranks, args.healthy_seconds, args.durations), flush=True)
    print(f"load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
