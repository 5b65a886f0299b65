"""`fsdpmon top`: flags, choosing the source, `--once`/`--json` output and exit status."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose import Verdict, judge
from fsdpmon.errors import JobUnhealthyError, UnreachableError, UsageError
from fsdpmon.job.snapshot import JobSnapshot, JobState
from fsdpmon.scrape.options import add_source_args, build_source
from fsdpmon.top.app import run_live
from fsdpmon.top.views import once_frame

_SPAN = f"{DIAGNOSIS_EVIDENCE_SECONDS:.0f} s"
EPILOG = f"""\
keys: 1 ranks, 2 GPUs, 3 processes, 4 logs, 5 diagnosis (findings, evidence, merged
      stacks), Tab next view, arrows/j/k move, Enter opens the selected rank/GPU/process,
      Esc back, / filter as you type, F follow the straggler, < > sort column, i invert,
      ? help, q quit

--once and --json are one refresh: they name what it shows (a rank past its stall
threshold, a target that did not answer, a rank gone or never seen, a GPU not seen up,
a non-finite loss, a flagged straggler, memory pressure) with the causes `fsdpmon
diagnose` uses; what needs {_SPAN} of history (a hang's culprit, a throttled GPU, XIDs, a
crash loop) is `fsdpmon diagnose`'s to say. --json prints the snapshot with "findings"
(as `fsdpmon diagnose --json` lists them).

exit status with --once or --json:
  0  no critical finding: the job is RUNNING, DEGRADED (straggler, memory pressure) or DONE
  3  nothing could be reached (no target answered; API server or Prometheus unreachable)
  4  the job is unhealthy: a critical finding (a rank stalled, gone or never seen, some
     targets down, a GPU lost, a non-finite loss), or the job FAILED or is RESTARTING
  2  bad flags
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_source_args(parser)
    out = parser.add_argument_group("display")
    out.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                     help="seconds between refreshes (default: %(default)s)")
    out.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                     help="per-target scrape timeout in seconds (default: %(default)s)")
    out.add_argument("--once", action="store_true", help="print one frame as text and exit")
    out.add_argument("--json", action="store_true",
                     help="print the job snapshot and its findings as JSON and exit "
                          "(implies --once)")


def check_health(snap: JobSnapshot, verdict: Verdict) -> None:
    """The documented exit status of `--once`: the job's lifecycle where it ended or cannot be
    seen, else the findings: raise for an unreachable job, a failed or restarting one, or a
    critical finding."""
    if snap.state is JobState.DONE:  # the training endpoints going away is how a job ends
        return
    if snap.state is JobState.DOWN:
        down = [t for t in snap.targets if not t.up]
        reasons = "; ".join(f"{t.url}: {t.error}" for t in down[:3]) or "no targets found"
        raise UnreachableError(f"no target answered ({reasons})")
    critical = verdict.critical
    finding = f"{critical[0].cause}: {critical[0].summary}" if critical else ""
    if snap.state in (JobState.FAILED, JobState.RESTARTING):
        why = snap.reason or finding  # the job's own word first
    elif critical:
        why = finding
    else:
        return
    raise JobUnhealthyError(f"job {snap.job_name or '?'} is {snap.state.value}"
                            + (f" ({why})" if why else ""))


def snapshot_json(snap: JobSnapshot, verdict: Verdict) -> str:
    """`--json`'s document: the snapshot, and its findings as `fsdpmon diagnose --json` has
    them (strict JSON: NaN and infinities become null)."""
    doc = snap.to_dict()
    doc["findings"] = [f.to_dict() for f in (*verdict.findings, *verdict.glance)]
    return json.dumps(doc, indent=2, allow_nan=False)


def run(args: argparse.Namespace) -> int:
    source = build_source(args)
    if not (args.once or args.json):
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            source.close()
            raise UsageError("no terminal; use --once or --json")
        return run_live(source, args.interval)
    try:
        snap = source.fetch()
    finally:
        source.close()
    notice = getattr(source, "notice", "")
    if notice:
        print(f"fsdpmon top: warning: {notice}", file=sys.stderr)
    verdict = judge([snap])  # one refresh: the glance alone, no finding without its window
    if args.json:
        sys.stdout.write(snapshot_json(snap, verdict) + "\n")
    else:
        Console(soft_wrap=False).print(once_frame(snap, verdict))
    sys.stdout.flush()
    check_health(snap, verdict)
    return 0
