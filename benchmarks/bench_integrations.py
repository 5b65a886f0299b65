"""Each way of training in examples/ as its own 2-rank CPU job, one library at a time (the suite
runs them side by side): the phases of tests/test_integrations.py, with how long each took and
what `fsdpmon diagnose` said. Prints measurements; asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_integrations.py [LIBRARY ...]``
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from diagnose_job import cli_findings, diagnose_cli, stepping
from integration_job import (
    EXAMPLES,
    example_job,
    get,
    open_gate,
    records,
    score_of,
    scored,
    tokens_per_second_check,
)

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD

WATCH = f"{DIAGNOSIS_EVIDENCE_SECONDS + 2:g}s"


def said(proc) -> str:
    code, findings = cli_findings(proc)
    return f"exit {code}: " + (", ".join(f"{f['cause']}@rank{f['rank']}" for f in findings)
                               or "nobody")


def one(library: str, tmp: Path) -> None:
    t0 = time.monotonic()
    with example_job(tmp, library) as job:
        job.wait("stepping", stepping(2), 240)
        job.wait("scored", scored, 120)
        up = time.monotonic() - t0
        healthy = said(diagnose_cli(job, WATCH))
        gate = time.monotonic()
        open_gate(job, "compute-slow")
        job.wait("score below", lambda s: (score_of(s, 1) or 1) < STRAGGLER_SCORE_THRESHOLD, 90)
        below = time.monotonic() - gate
        slowed = said(diagnose_cli(job, WATCH))
        named = time.monotonic() - gate
        gate = time.monotonic()
        open_gate(job, "hang")
        while True:
            doc = json.loads(get(job, "/stacks"))
            if len(doc["ranks"]) == 2 and all(r["stalled"] for r in doc["ranks"]):
                break
            time.sleep(0.5)
        hang = time.monotonic() - gate
        seqs = {r["rank"]: (r["last_collective"] or {}).get("seq") for r in doc["ranks"]}
    rates = [tokens_per_second_check(records(job, r)) for r in (0, 1)]
    errors = ", ".join(f"{s / t - 1:+.3%} (bound {b:.3%})" for s, t, b in rates)
    print(f"{library:10s} scored after {up:5.1f}s | healthy: {healthy} | slowed: score below "
          f"the line {below:4.1f}s after, {slowed} ({named:4.1f}s) | hang: both stalled "
          f"{hang:4.1f}s after, last collective {seqs} | tokens/s vs JSONL: {errors} | "
          f"total {time.monotonic() - t0:5.1f}s", flush=True)


def main() -> None:
    libraries = sys.argv[1:] or list(EXAMPLES)
    for library in libraries:
        with tempfile.TemporaryDirectory() as tmp:
            one(library, Path(tmp))


if __name__ == "__main__":
    main()
