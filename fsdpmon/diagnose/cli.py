"""`fsdpmon diagnose`: watch the job for a short while, then say what is wrong and where.

Same sources as `top`; the verdicts come from the pure engine (fsdpmon.diagnose) over the
snapshots gathered here, with the stalled ranks' `/stacks` when a rank stops making progress.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, Severity
from fsdpmon.diagnose import Verdict
from fsdpmon.diagnose.evidence import Diagnoser
from fsdpmon.diagnose.report import report_lines
from fsdpmon.errors import JobUnhealthyError, UnreachableError
from fsdpmon.job.snapshot import JobSnapshot, JobState
from fsdpmon.scrape.options import Source, add_source_args, build_source, parse_duration

DEFAULT_FOR = f"{DIAGNOSIS_EVIDENCE_SECONDS + 2:.0f}s"
_SPAN = f"{DIAGNOSIS_EVIDENCE_SECONDS:.0f} s"

EPILOG = f"""\
how long a verdict takes:
  A finding needs its evidence in every refresh for {_SPAN} (never one sample), so
  diagnose watches for --for (default {DEFAULT_FOR}) at --interval before it answers:
  - a throttled GPU, lost GPU, non-finite loss: {_SPAN} after it starts;
  - a straggler: {_SPAN} after the monitor's busy-time median is past the fault (when half
    the steps it spans are slow ones);
  - a slow checkpoint: {_SPAN} after the first slow save ends;
  - a hang: {_SPAN} after the ranks pass their stall threshold (the monitor's:
    max(10 x median step time, floor));
  - an XID, ECC error or restart: once its counter rises between two refreshes.

causes: hang, rank_unresponsive, rank_missing, crash_loop, straggler_compute, straggler_data,
  gpu_throttled, gpu_xid, gpu_lost, gpu_ecc, loss_nonfinite, loss_spike, memory_pressure,
  checkpoint_slow, host_cpu_contention, target_down (see docs/runbook.md)

exit status:
  0  no finding, or warnings only (straggler, throttled GPU, memory pressure, ...)
  3  nothing could be reached
  4  a critical finding stands (hang, lost GPU, missing rank, ...), as `top --once` on a stall
  2  bad flags
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_source_args(parser)
    out = parser.add_argument_group("watch and output")
    out.add_argument("--for", dest="watch", default=DEFAULT_FOR, metavar="DURATION",
                     help=f"how long to watch before answering: 30s, 2m (default {DEFAULT_FOR})")
    out.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    out.add_argument("--timeout", type=float, default=3.0, help="per-target scrape timeout (s)")
    out.add_argument("--json", action="store_true",
                     help='print {"findings": [...], "time": ..., "evidence_seconds": ...} as '
                          'JSON (evidence_seconds below the window: no verdict yet)')


def watch(diagnoser: Diagnoser, source: Source, seconds: float, interval: float
          ) -> tuple[JobSnapshot, Verdict]:
    """Refreshes until ``seconds`` have passed (at least once); the last snapshot and verdict."""
    start = time.monotonic()
    while True:
        began = time.monotonic()
        snap = source.fetch()
        verdict = diagnoser.update(snap)
        left = seconds - (time.monotonic() - start)
        if left <= 0:
            return snap, verdict
        time.sleep(min(left, max(0.0, interval - (time.monotonic() - began))))


def run(args: argparse.Namespace) -> int:
    seconds = parse_duration("--for", args.watch, allow_zero=True)  # 0: one refresh
    source = build_source(args)
    try:
        snap, verdict = watch(Diagnoser(source, args.timeout), source, seconds, args.interval)
    finally:
        source.close()
    findings = list(verdict.findings)
    if args.json:
        doc = {"findings": [f.to_dict() for f in findings], "time": snap.time,
               "evidence_seconds": round(verdict.seconds, 3),
               "job": snap.job_name, "state": snap.state.value}
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        print(f"fsdpmon diagnose: job {snap.job_name or '?'} {snap.state.value}, "
              f"{len(snap.ranks)} ranks, {len(snap.gpus)} GPUs, watched {seconds:g}s")
        print("\n".join(report_lines(findings)))
    sys.stdout.flush()
    if snap.state is JobState.DOWN:
        raise UnreachableError("no target answered")
    critical = [f for f in findings if f.severity is Severity.CRITICAL]
    if critical:
        raise JobUnhealthyError(f"{critical[0].cause}: {critical[0].summary}")
    return 0
