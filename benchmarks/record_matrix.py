"""Record the fault matrix once, for tests/test_doors_agree.py: every fault kind of
bench_diagnose.py and bench_blind.py that runs on a CPU machine, plus a healthy run saving
checkpoints, each a real 2-rank CPU job of the bundled trainer (tests/diagnose_job.py) with the
exporter's simulated GPUs beside it.

For each run it keeps, over time (a scrape every ~1 s, from the exporter's start until the live
judge has named the fault and TAIL_S more, or until the fault's deadline):
  - each target's exposition text (the pod's endpoint, the exporter), as served;
  - the pod's /stacks document (what `diagnose` fetches while a rank is stalled);
  - the run's JSONL files (--log-jsonl) at the end.
The raw recording goes to --raw (one JSON per run); `--pack` then writes the compact test data
(tests/data/matrix/<run>.json.xz: every exposition whole, xz-compressed).
Not a test: it trains. Run once: ``.venv/bin/python benchmarks/record_matrix.py`` (about 20 min
on a 2-core machine), then ``--pack``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

import bench_blind  # noqa: E402
import bench_diagnose  # noqa: E402
from cpu_starve import QuotaUnavailable  # noqa: E402
from diagnose_job import REPO, faulty_job, named, stepping, workers  # noqa: E402

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS  # noqa: E402
from fsdpmon.scrape.httpget import ScrapeError, http_get  # noqa: E402

RANKS = 2
SCRAPE_EVERY_S = 1.0
TAIL_S = 20.0  # kept after the live judge names the fault: spans and rules need some length
FAULT_DEADLINE_S = 90.0  # from the fault's start: recorded anyway, marked unnamed
HEALTHY_S = 75.0
OUT = REPO / "tests" / "data" / "matrix"


def matrix() -> list[dict]:
    """Every run: name, expected cause and rank (None for the healthy run), how it is made."""
    rows = []
    for name, spec, gpu, cause, rank, gpu_id in bench_diagnose.MATRIX:
        rows.append({"name": name, "cause": cause, "rank": rank, "gpu": gpu_id,
                     "spec": spec, "gpu_spec": gpu, "also": bench_diagnose.ALSO.get(name, ()),
                     "restarts": bench_diagnose.RESTARTS.get(name, 0),
                     "extra": ("--checkpoint-every", "20") if name == "checkpoint-slow" else ()})
    for name, (cause, rank, make) in bench_blind.FAULTS.items():
        rows.append({"name": name, "cause": cause, "rank": rank, "gpu": None,
                     "spec": bench_blind.SPECS.get(name, ""), "gpu_spec": "", "also": (),
                     "restarts": 0, "extra": bench_blind.EXTRA.get(name, ()), "outside": make,
                     "starts": bench_blind.STARTS.get(name),
                     "env": bench_blind.ENVS.get(name),
                     "entry": bench_blind.ENTRIES.get(name, bench_blind.ENTRY),
                     "begins": bench_blind.BEGINS.get(name)})
    rows.append({"name": "healthy", "cause": None, "rank": None, "gpu": None, "spec": "",
                 "gpu_spec": "", "also": (), "restarts": 0,
                 "extra": ("--checkpoint-every", "20")})
    return rows


def _get(url: str) -> str | None:
    try:
        return http_get(url, 2.0, max_bytes=16 * 1024 * 1024).decode()
    except ScrapeError:
        return None


def _frame(job) -> dict:
    metrics = [_get(f"http://{u}/metrics") for u in job.urls]
    return {"t": time.time(), "metrics": metrics, "stacks": _get(f"http://{job.urls[0]}/stacks")}


def record(row: dict, raw: Path) -> str:
    name = row["name"]
    after = DIAGNOSIS_EVIDENCE_SECONDS + 2
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        extra = (*row["extra"], "--log-jsonl", str(tmp / "logs" / "run.jsonl"))
        if "--checkpoint-every" in extra:
            extra = (*extra, "--checkpoint-dir", str(tmp / "ckpt"))
        kw = {"entry": row["entry"]} if "entry" in row else {}
        with faulty_job(tmp, RANKS, row["spec"], extra, row["restarts"],
                        env_extra=row.get("env"), **kw) as job, contextlib.ExitStack() as stack:
            job.wait("stepping", stepping(RANKS), 300)
            job.start_exporter(row["gpu_spec"].format(after=after))
            fault_at = None
            if row.get("outside") is not None:
                try:
                    stack.enter_context(row["outside"](job, workers(job)))
                except QuotaUnavailable as why:
                    return f"{name:<17} skipped: {why}"
                fault_at = None if row.get("starts") else time.monotonic()
            started = (bench_diagnose._fault_started(job, name, row["gpu_spec"], after)
                       if row.get("begins") is None else
                       lambda snap: any((r.step or 0) >= row["begins"] for r in snap.ranks))
            if row.get("starts"):
                started = lambda snap: row["starts"]()  # noqa: E731
            frames, named_at, said = [], None, ""
            end = time.monotonic() + (HEALTHY_S if row["cause"] is None else 600)
            while time.monotonic() < end:
                began = time.monotonic()
                frames.append(_frame(job))
                snap, verdict = job.refresh()
                said = ", ".join(f"{f.cause}(rank {f.rank})" for f in verdict.findings)
                if row["cause"] is not None:
                    if fault_at is None and started(snap):
                        fault_at = time.monotonic()
                        end = fault_at + FAULT_DEADLINE_S
                    hit = any(named(verdict.findings, c, row["rank"], row["gpu"])
                              for c in (row["cause"], *row["also"]))
                    if fault_at is not None and hit and named_at is None:
                        named_at = time.monotonic()
                        end = named_at + TAIL_S
                time.sleep(max(0.0, SCRAPE_EVERY_S - (time.monotonic() - began)))
            files = {str(p.relative_to(tmp / "logs")): p.read_text()
                     for p in sorted((tmp / "logs").rglob("*")) if p.is_file()}
    doc = {"name": name, "cause": row["cause"], "rank": row["rank"], "gpu": row["gpu"],
           "ranks": RANKS, "targets": ["train", "exporter"], "frames": frames, "files": files,
           "live_named_after_s": None if named_at is None or fault_at is None
           else round(named_at - fault_at, 1)}
    (raw / f"{_slug(name)}.json").write_text(json.dumps(doc))
    return (f"{name:<17} {len(frames)} frames, named after {doc['live_named_after_s']} s; "
            f"last said: {said or 'nothing'}")


def pack(raw: Path, out: Path) -> list[str]:
    """Each raw recording xz-compressed into ``out`` (consecutive scrapes repeat most of their
    text, which xz's window finds and gzip's 32 KiB one does not: 4-5x smaller than gzip), with
    the names the live judge may also give the fault (bench_diagnose.ALSO)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for path in sorted(raw.glob("*.json")):
        doc = json.loads(path.read_text())
        doc["also"] = list(bench_diagnose.ALSO.get(doc["name"], ()))
        packed = lzma.compress(json.dumps(doc, separators=(",", ":")).encode(), preset=9)
        (out / f"{path.stem}.json.xz").write_bytes(packed)
        lines.append(f"{path.stem}: {len(doc['frames'])} frames, {len(packed) / 1024:.0f} KiB")
    return lines


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--raw", type=Path, default=Path("/tmp/fsdpmon-matrix-raw"))
    parser.add_argument("--only", nargs="*", help="run names to record (default: all)")
    parser.add_argument("--pack", action="store_true",
                        help=f"write {OUT.relative_to(REPO)} from --raw (records nothing)")
    args = parser.parse_args()
    if args.pack:
        for line in pack(args.raw, OUT):
            print(line)
        return
    args.raw.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs; load average at start: "
          + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    for row in matrix():
        if args.only is None or row["name"] in args.only:
            print("  " + record(row, args.raw) + f"  (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    print("load average at end: " + " ".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
