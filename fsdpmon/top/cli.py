"""`fsdpmon top`: flags, choosing the source, `--once`/`--json` output and exit status."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from fsdpmon.errors import ConfigError, JobUnhealthyError, UnreachableError, UsageError
from fsdpmon.top.app import Source, run_live
from fsdpmon.top.snapshot import JobSnapshot, JobState
from fsdpmon.top.views import once_frame

SOURCES = """\
Choose one: --targets (scrape endpoints directly, no cluster needed); --job or --selector (find
the pods through the Kubernetes API with the kubeconfig, --context or the in-cluster config, and
scrape them via the API server's pod proxy from outside or by pod IP from inside); or --prometheus
(query Prometheus, for jobs too large to scrape pod by pod; --job then names the job_name)."""

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


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """The source flags `top` and `diagnose` share."""
    src = parser.add_argument_group("source", SOURCES)
    src.add_argument("--targets", metavar="URL[,URL...]",
                     help="comma-separated /metrics endpoints (host:port or full URL)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus base URL to query")
    src.add_argument("--job", metavar="NAME",
                     help="training job name (PyTorchJob or TrainJob; job_name with --prometheus)")
    src.add_argument("--selector", metavar="SELECTOR",
                     help="label selector for the training pods (instead of --job)")
    src.add_argument("-n", "--namespace", default=None,
                     help="Kubernetes namespace (default: the kubeconfig context's)")
    src.add_argument("--context", help="kubeconfig context to use (default: the current one)")
    src.add_argument("--kubeconfig",
                     help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


def _split(urls: str) -> list[str]:
    return [u for u in (part.strip() for part in urls.split(",")) if u]


def build_source(args: argparse.Namespace) -> Source:
    if args.interval <= 0:
        raise ConfigError("--interval", f"must be > 0, got {args.interval!r}")
    _one_source(args)
    if args.targets is not None:
        from fsdpmon.top.sources.targets import TargetsSource

        return TargetsSource(_split(args.targets), timeout_s=args.timeout)
    if args.prometheus:
        from fsdpmon.top.sources.prometheus import PrometheusSource

        return PrometheusSource(args.prometheus, job_name=args.job or "", timeout_s=args.timeout)
    if args.job or args.selector:
        from fsdpmon.top.sources.kube import KubeSource, KubeSourceConfig

        return KubeSource(KubeSourceConfig(
            job=args.job or "", selector=args.selector or "", namespace=args.namespace,
            context=args.context, kubeconfig=args.kubeconfig, timeout_s=args.timeout))
    raise ConfigError("--targets", "choose a source: --targets URL, --job NAME, --selector SEL "
                                   "or --prometheus URL")


def _one_source(args: argparse.Namespace) -> None:
    """One source, and no flag that only another source reads (it would be silently ignored)."""
    given = {flag: value for flag, value in (
        ("--targets", args.targets), ("--prometheus", args.prometheus), ("--job", args.job),
        ("--selector", args.selector), ("--namespace", args.namespace),
        ("--context", args.context), ("--kubeconfig", args.kubeconfig)) if value is not None}
    allowed = ({"--targets"} if "--targets" in given
               else {"--prometheus", "--job"} if "--prometheus" in given
               else {"--job", "--selector", "--namespace", "--context", "--kubeconfig"})
    extra = [flag for flag in given if flag not in allowed]
    if extra:
        source = "--targets" if "--targets" in given else "--prometheus"
        raise ConfigError(extra[0], f"cannot be combined with {source} (choose one source)")


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
