"""The command-line plumbing the commands share: the source flags (`top`, `diagnose`), the flags
that read jobs' history from Prometheus (`incidents`, `report`), the RUN arguments (JSONL logs),
the one job flag and the one duration parser, and the :class:`Source` a live command reads a
job's snapshots from.

Values are checked where the command runs, not by argparse: a bad one is a ConfigError naming
its flag, which `fsdpmon.cli.guarded` turns into one line and exit status 2."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Protocol

from fsdpmon.errors import ConfigError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.prometheus_api import PrometheusAPI

SOURCES = """\
Choose one: --targets (scrape endpoints directly, no cluster needed); --job or --selector (find
the pods through the Kubernetes API with the kubeconfig, --context or the in-cluster config, and
scrape them via the API server's pod proxy from outside or by pod IP from inside); or --prometheus
(query Prometheus, for jobs too large to scrape pod by pod; --job then names the job_name)."""

# A number and an optional unit (seconds without one); "1.5h" and "30 s" are durations too.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?")
_UNIT_SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
DURATION_EXAMPLES = "45, 30s, 2m, 24h or 7d"


class Source(Protocol):
    description: str

    def fetch(self) -> JobSnapshot: ...

    def close(self) -> None: ...


def parse_duration(flag: str, text: str, *, allow_zero: bool = False) -> float:
    """The seconds a duration flag names; more than zero unless ``allow_zero`` (``diagnose
    --for 0`` is one refresh)."""
    match = _DURATION.fullmatch((text or "").strip())
    if not match:
        raise ConfigError(flag, f"{text!r} is not a duration like {DURATION_EXAMPLES}")
    seconds = float(match[1]) * _UNIT_SECONDS[match[2] or "s"]
    if seconds <= 0 and not allow_zero:
        raise ConfigError(flag, f"{text!r} is not longer than 0")
    return seconds


class _JobNames(argparse.Action):
    """``--job``, repeatable, each value a name or several comma-separated; the raw values are
    kept (split by :func:`job_names`, where an empty one can be a one-line error). A renamed
    spelling lands in the same list after a one-line deprecation note."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        if option_string != "--job":
            print(f"{parser.prog}: {option_string} is deprecated; use --job (repeatable)",
                  file=sys.stderr)
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])


def _add_job(group: argparse._ArgumentGroup, text: str, renamed: tuple[str, ...]) -> None:
    group.add_argument("--job", action=_JobNames, metavar="NAME", help=text)
    for old in renamed:  # hidden from --help, still accepted
        group.add_argument(old, action=_JobNames, dest="job", help=argparse.SUPPRESS)


def _add_prometheus(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--prometheus", metavar="URL", help="Prometheus base URL to query")


def job_names(args: argparse.Namespace) -> list[str]:
    """Every name the --job flags gave, in order; [] when none was given."""
    names = [n.strip() for value in args.job or [] for n in value.split(",") if n.strip()]
    if args.job and not names:
        raise ConfigError("--job", "give at least one job name")
    return names


def add_runs_arg(parser: argparse.ArgumentParser, nargs: str,
                 directory: str = "their directory") -> None:
    """The RUN arguments of the commands that read the trainer's JSONL logs; ``directory`` says
    what a directory given holds."""
    parser.add_argument("runs", nargs=nargs, metavar="RUN",
                        help="a run's JSONL: the trainer's --log-jsonl PATH (its per-rank files "
                        f"PATH.rank<k>.jsonl are read), one per-rank file, or {directory}")


def add_source_args(parser: argparse.ArgumentParser) -> None:
    """The source flags of the live commands, `top` and `diagnose`."""
    src = parser.add_argument_group("source", SOURCES)
    src.add_argument("--targets", metavar="URL[,URL...]",
                     help="comma-separated /metrics endpoints (host:port or full URL)")
    _add_prometheus(src)
    _add_job(src, "training job name (PyTorchJob or TrainJob; job_name with --prometheus)", ())
    src.add_argument("--selector", metavar="SELECTOR",
                     help="label selector for the training pods (instead of --job)")
    src.add_argument("-n", "--namespace", default=None,
                     help="Kubernetes namespace (default: the kubeconfig context's)")
    src.add_argument("--context", help="kubeconfig context to use (default: the current one)")
    src.add_argument("--kubeconfig",
                     help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


def add_history_args(parser: argparse.ArgumentParser, title: str, step: str,
                     renamed: tuple[str, ...] = (), until: bool = False) -> None:
    """The flags that read jobs' history from Prometheus (`incidents`, `report`); ``step`` says
    the query resolution's default, ``renamed`` the job flag's old spellings still accepted,
    ``until`` whether the range may end before now."""
    prom = parser.add_argument_group(title)
    _add_prometheus(prom)
    _add_job(prom, "job name (the job_name label); repeat, or comma-separate, for several jobs",
             renamed)
    prom.add_argument("--since", default="24h", metavar="DURATION",
                      help="how far back to look, e.g. 90m, 24h, 7d")
    if until:
        prom.add_argument("--until", default=None, metavar="TIME",
                          help="end of the search range: unix seconds or ISO 8601 (default: now)")
    prom.add_argument("--step", type=float, default=None, metavar="SECONDS",
                      help=f"query resolution (default: {step})")
    prom.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                      help="HTTP timeout per query")


def history_jobs(args: argparse.Namespace) -> list[str]:
    """The jobs to read from Prometheus ([] for none): --prometheus and --job go together."""
    jobs = job_names(args)
    if bool(jobs) != bool(args.prometheus):
        raise ConfigError("--job" if args.prometheus else "--prometheus",
                          "--prometheus and --job go together")
    return jobs


def history_api(args: argparse.Namespace, until: float) -> tuple[PrometheusAPI, float]:
    """The Prometheus client the history flags name, and the start of their range (``--since``
    before ``until``)."""
    for flag, value in (("--step", args.step), ("--timeout", args.timeout)):
        if value is not None and not value > 0:
            raise ConfigError(flag, f"must be > 0 seconds, got {value!r}")
    since = until - parse_duration("--since", args.since)
    return PrometheusAPI(args.prometheus, timeout_s=args.timeout), since


def _split(urls: str) -> list[str]:
    return [u for u in (part.strip() for part in urls.split(",")) if u]


def build_source(args: argparse.Namespace) -> Source:
    if args.interval <= 0:
        raise ConfigError("--interval", f"must be > 0, got {args.interval!r}")
    job = _one_job(args)
    _one_source(args, job)
    if args.targets is not None:
        from fsdpmon.scrape.sources.targets import TargetsSource

        return TargetsSource(_split(args.targets), timeout_s=args.timeout)
    if args.prometheus:
        from fsdpmon.scrape.sources.prometheus import PrometheusSource

        return PrometheusSource(args.prometheus, job_name=job or "", timeout_s=args.timeout)
    if job or args.selector:
        from fsdpmon.scrape.sources.kube import KubeSource, KubeSourceConfig

        return KubeSource(KubeSourceConfig(
            job=job or "", selector=args.selector or "", namespace=args.namespace,
            context=args.context, kubeconfig=args.kubeconfig, timeout_s=args.timeout))
    raise ConfigError("--targets", "choose a source: --targets URL, --job NAME, --selector SEL "
                                   "or --prometheus URL")


def _one_job(args: argparse.Namespace) -> str | None:
    """A live view watches one job: the one name --job gave, or None."""
    names = job_names(args)
    if len(names) > 1:
        raise ConfigError("--job", f"name one job to watch, got {len(names)}: "
                                   f"{', '.join(names)}")
    return names[0] if names else None


def _one_source(args: argparse.Namespace, job: str | None) -> None:
    """One source, and no flag that only another source reads (it would be silently ignored)."""
    given = {flag: value for flag, value in (
        ("--targets", args.targets), ("--prometheus", args.prometheus), ("--job", job),
        ("--selector", args.selector), ("--namespace", args.namespace),
        ("--context", args.context), ("--kubeconfig", args.kubeconfig)) if value is not None}
    allowed = ({"--targets"} if "--targets" in given
               else {"--prometheus", "--job"} if "--prometheus" in given
               else {"--job", "--selector", "--namespace", "--context", "--kubeconfig"})
    extra = [flag for flag in given if flag not in allowed]
    if extra:
        source = "--targets" if "--targets" in given else "--prometheus"
        raise ConfigError(extra[0], f"cannot be combined with {source} (choose one source)")
