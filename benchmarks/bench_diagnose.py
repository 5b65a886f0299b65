"""Benchmark the diagnosis: how long each fault takes to be named on a real CPU job, how many
false findings a healthy run gets, and what the engine costs on a 2048-rank job.

Prints, from one run:
  - fault by fault (torchrun CPU ranks of the bundled trainer, the exporter with simulated
    GPUs, each fault injected through --fault): the cause and culprit fsdpmon named and the
    seconds from the fault starting to the first refresh naming it (the target is
    max(3 log windows, 30 s)), or what it said instead;
  - healthy runs of --healthy-seconds of wall time at each of --healthy-ranks (saving every 50
    steps), each watched three ways: the findings the engine raised, every alert that went
    pending or firing in a real Prometheus loaded with the shipped rules as generated
    (tests/shipped_alerts.py), and the monitor's straggler flags in every rank's JSONL (all
    should be none); then each alert seen, with its labels, times, values and expression
    (healthy_runs.py);
  - the engine on a 256 x 8 job (2048 ranks, a hang with 2048 published stacks) against one
    `top` refresh of the same job (fetch + parse + aggregate + render), measured side by side.
Not a test: figures depend on the machine. Run `python benchmarks/bench_diagnose.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_top  # noqa: E402
from bench_top import timed_refresh  # noqa: E402
from diagnose_job import faulty_job, named, stepping  # noqa: E402
from healthy_runs import run_healthy  # noqa: E402
from rich.console import Console  # noqa: E402

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS  # noqa: E402
from fsdpmon.diagnose import RankStack, diagnose  # noqa: E402
from fsdpmon.diagnose.stacks import Frame  # noqa: E402
from fsdpmon.scrape.sources.targets import TargetsSource  # noqa: E402

BOUND_S = 30.0  # max(3 log windows, 30 s); a log window here (5 steps) is well under 10 s
S = 60  # trainer faults start at this step: after the job has settled
# (fault, trainer spec, exporter spec, expected cause, expected rank, expected GPU)
MATRIX = [
    ("compute-slow", f"compute-slow:rank=1,factor=4,from_step={S}", "", "straggler_compute",
     1, None),
    ("data-slow", f"data-slow:rank=1,seconds=0.3,from_step={S}", "", "straggler_data", 1, None),
    ("hang (data)", f"hang:rank=1,at_step={S},where=data", "", "hang", 1, None),
    ("hang (host)", f"hang:rank=1,at_step={S},where=host", "", "hang", 1, None),
    ("nonfinite-loss", f"nonfinite-loss:rank=1,from_step={S}", "", "loss_nonfinite", 1, None),
    ("checkpoint-slow", "checkpoint-slow:rank=1,seconds=4", "", "checkpoint_slow", 1, None),
    ("crash", f"crash:rank=1,at_step={S}", "", "rank_missing", 1, None),
    ("gpu-throttle", "", "gpu-throttle:gpu=1,after={after},reason=thermal", "gpu_throttled", 1,
     "1"),
    ("xid", "", "xid:gpu=1,code=79,after={after}", "gpu_xid", 1, "1"),
    ("gpu-lost", "", "gpu-lost:gpu=1,after={after}", "gpu_lost", 1, "1"),
    ("ecc-uncorrected", "", "ecc-uncorrected:gpu=1,after={after}", "gpu_ecc", 1, "1"),
]
ALSO = {"hang (host)": ("rank_unresponsive",)}  # a rank stopped in host code is that, too
# The crash is SIGKILL on the first attempt: torchrun's agent stops the other ranks and restarts
# the group, whose restarted rank 1 says it was killed (while all are gone, none is named).
RESTARTS = {"crash": 1}


def _fault_started(job, name: str, gpu_spec: str, after: float):
    """A function telling, per snapshot, whether the fault has started (and since when)."""
    if gpu_spec:
        return lambda snap: time.monotonic() >= job.exporter_started + after
    if name == "checkpoint-slow":  # the first checkpoint save after the job settled
        return lambda snap: any((r.step or 0) >= 20 for r in snap.ranks)
    if name == "crash":  # the ranks may die between two refreshes, before step S shows
        return lambda snap: any((r.step or 0) >= S or r.down for r in snap.ranks)
    return lambda snap: any((r.step or 0) >= S for r in snap.ranks)


def run_fault(row, ranks: int) -> str:
    name, train_spec, gpu_spec, cause, rank, gpu = row
    after = DIAGNOSIS_EVIDENCE_SECONDS + 2
    extra = ("--checkpoint-every", "20", "--checkpoint-dir", "{tmp}") \
        if name == "checkpoint-slow" else ()
    with tempfile.TemporaryDirectory() as tmp:
        extra = tuple(a.replace("{tmp}", tmp) for a in extra)
        with faulty_job(Path(tmp), ranks, train_spec, extra, RESTARTS.get(name, 0)) as job:
            job.wait("stepping", stepping(ranks), 300)
            job.start_exporter(gpu_spec.format(after=after))
            started = _fault_started(job, name, gpu_spec, after)
            fault_at, said = None, []
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                snap, verdict = job.refresh()
                now = time.monotonic()
                if fault_at is None and started(snap):
                    fault_at = now
                    deadline = now + BOUND_S + 30
                hit = next((f for c in (cause, *ALSO.get(name, ()))
                            if (f := named(verdict.findings, c, rank, gpu))), None)
                if fault_at is not None and hit:
                    return (f"{name:<16} {hit.cause:<18} rank {hit.rank} gpu {hit.gpu} "
                            f"node {hit.node}  {now - fault_at:5.1f}s"
                            f"{'' if now - fault_at <= BOUND_S else '  (over the bound)'}")
                said = [f"{f.cause}(rank {f.rank}, gpu {f.gpu})" for f in verdict.findings]
                time.sleep(0.5)
            return f"{name:<16} NOT NAMED as {cause}; said: {', '.join(said) or 'nothing'}"


def _stacks(world: int, odd: int) -> list[RankStack]:
    outer = tuple(Frame(f"/app/trainer/layer{i}.py", 10 + i, f"f{i}") for i in range(20))
    wait = (*outer, Frame("/torch/distributed/fsdp/_fsdp_collectives.py", 301,
                          "foreach_all_gather"))
    data = (*outer, Frame("/app/trainer/data.py", 123, "next_batch"))
    return [RankStack(r, 812, "forward", True, "all_gather_into_tensor",
                      21936 if r == odd else 21937, data if r == odd else wait)
            for r in range(world)]


def bench_engine(args: argparse.Namespace) -> None:
    ports, stop, procs = bench_top.start_servers(args.servers, args.nodes, args.gpus)
    from synthetic_job import job_expositions

    paths = sorted(job_expositions("x", args.nodes, 1))
    urls = bench_top.pod_urls(ports, paths)
    source = TargetsSource(urls, timeout_s=10.0, max_workers=16)
    console = Console(width=200, height=50, color_system="truecolor", force_terminal=True)
    try:
        timed_refresh(source, console)
        snaps, refresh_s = [], []
        for _ in range(args.refreshes):
            refresh_s.append(timed_refresh(source, console)[0])
            snaps.append(source.fetch())
    finally:
        source.close()
        stop.set()
        for p in procs:
            p.join(timeout=10)
    # The same job as a history 2 s apart, healthy and hung (every rank stalled).
    t0 = snaps[0].time
    healthy = [replace(s, time=t0 + 2.0 * i) for i, s in enumerate(snaps)]
    hung = [replace(s, ranks=tuple(replace(r, stalled=True, heartbeat_age_s=300.0)
                                   for r in s.ranks)) for s in healthy]
    world = len(snaps[-1].ranks)
    stacks = _stacks(world, odd=17)

    def timed(history, st) -> float:
        runs = []
        for _ in range(args.engine_repeat):
            start = time.perf_counter()
            found = diagnose(history, st)
            runs.append(time.perf_counter() - start)
        assert history is healthy or found[0].rank == 17, found[:1]
        return statistics.median(runs)

    ok, hang = timed(healthy, ()), timed(hung, stacks)
    refresh = statistics.median(refresh_s)
    print(f"engine on {world} ranks, {len(snaps[-1].gpus)} GPUs, history of {len(healthy)} "
          f"snapshots (median of {args.engine_repeat}):")
    print(f"  healthy: {ok * 1e3:.1f} ms; hang with {len(stacks)} stacks: {hang * 1e3:.1f} ms "
          f"(names rank 17)")
    print(f"  one top refresh of the same job (p50 of {len(refresh_s)}): {refresh * 1e3:.0f} ms"
          f" -> engine = {hang / refresh:.1%} of a refresh (bound 20%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "faults", "engine"), default="all")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2],
                        help="world sizes the faults run at")
    parser.add_argument("--healthy-ranks", type=int, nargs="*", default=[2, 4],
                        help="world sizes of the healthy runs (none: skip them)")
    parser.add_argument("--healthy-seconds", type=float, default=300.0)
    parser.add_argument("--healthy-keep", type=Path, default=None, metavar="DIR",
                        help="keep each healthy run's files (JSONL, Prometheus TSDB, logs) in "
                             "DIR/healthy<ranks> (DIR/healthy<ranks> must not exist)")
    parser.add_argument("--only", nargs="*", choices=[row[0] for row in MATRIX],
                        help="fault names to run (default: all)")
    parser.add_argument("--wide-only", nargs="*", choices=[row[0] for row in MATRIX],
                        help="of those, the ones also run at the --ranks after the first "
                             "(default: all)")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--refreshes", type=int, default=7)
    parser.add_argument("--engine-repeat", type=int, default=7)
    args = parser.parse_args()
    print("load average at start: " + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    if args.part in ("all", "engine"):
        bench_engine(args)
    if args.part in ("all", "faults"):
        for ranks in args.ranks:
            print(f"faults on {ranks} CPU ranks (time from the fault starting to the first "
                  f"refresh naming it; bound {BOUND_S:.0f}s):", flush=True)
            for row in MATRIX:
                wide = ranks != args.ranks[0]
                if (args.only is None or row[0] in args.only) and not (
                        wide and args.wide_only is not None and row[0] not in args.wide_only):
                    print("  " + run_fault(row, ranks), flush=True)
        for ranks in args.healthy_ranks:
            for line in run_healthy(ranks, args.healthy_seconds, args.healthy_keep):
                print("  " + line, flush=True)
    print("load average at end: " + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
