"""`fsdpmon top`: flags, choosing the source, `--once`/`--json` output and exit status."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from fsdpmon.errors import JobUnhealthyError, UnreachableError, UsageError
from fsdpmon.job.snapshot import JobSnapshot, JobState
from fsdpmon.scrape.options import add_source_args, build_source
from fsdpmon.top.app import run_live
from fsdpmon.top.views import once_frame

EPILOG = """\
keys: 1 ranks, 2 GPUs, 3 processes, 4 logs, 5 diagnosis (findings, evidence, merged
      stacks), Tab next view, arrows/j/k move, Enter opens the selected rank/GPU/process,
      Esc back, / filter as you type, F follow the straggler, < > sort column, i invert,
      ? help, q quit

exit status with --once or --json:
  0  the job is RUNNING, DEGRADED (straggler, memory pressure) or DONE
  3  nothing could be reached (no target answered; API server or Prometheus unreachable)
  4  the job is unhealthy: a rank is STALLED, the job FAILED or is RESTARTING, or some
     targets are down
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
                     help="print the job snapshot as JSON and exit (implies --once)")


def check_health(snap: JobSnapshot) -> None:
    """The documented exit status of `--once`: raise for an unreachable or unhealthy job."""
    down = [t for t in snap.targets if not t.up]
    if snap.state is JobState.DONE:  # the training endpoints going away is how a job ends
        return
    if snap.state is JobState.DOWN:
        reasons = "; ".join(f"{t.url}: {t.error}" for t in down[:3]) or "no targets found"
        raise UnreachableError(f"no target answered ({reasons})")
    if snap.state is JobState.STALLED:
        ranks = ", ".join(str(r) for r in snap.stalled_ranks[:8])
        raise JobUnhealthyError(f"job {snap.job_name or '?'} is STALLED (rank {ranks})")
    if snap.state in (JobState.FAILED, JobState.RESTARTING):
        why = snap.reason or next((a.message for a in snap.alerts if a.kind == "rank_down"), "")
        raise JobUnhealthyError(f"job {snap.job_name or '?'} is {snap.state.value}"
                                + (f" ({why})" if why else ""))
    if down:
        raise JobUnhealthyError(f"{len(down)} of {len(snap.targets)} targets down: "
                                + ", ".join(t.url for t in down[:3]))


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
    if args.json:
        sys.stdout.write(snap.to_json() + "\n")
    else:
        Console(soft_wrap=False).print(once_frame(snap))
    sys.stdout.flush()
    check_health(snap)
    return 0
