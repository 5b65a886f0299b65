"""Choosing a source from the command line: the flags `top` and `diagnose` share, and the
:class:`Source` each of them reads a job's snapshots from."""

from __future__ import annotations

import argparse
from typing import Protocol

from fsdpmon.errors import ConfigError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape import fastpath

SOURCES = """\
Choose one: --targets (scrape endpoints directly, no cluster needed); --job or --selector (find
the pods through the Kubernetes API with the kubeconfig, --context or the in-cluster config, and
scrape them via the API server's pod proxy from outside or by pod IP from inside); or --prometheus
(query Prometheus, for jobs too large to scrape pod by pod; --job then names the job_name)."""


class Source(Protocol):
    description: str

    def fetch(self) -> JobSnapshot: ...

    def close(self) -> None: ...


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
    fastpath.active()  # FSDPMON_PURE_PYTHON, checked at start (a ConfigError names it)
    if args.targets is not None:
        from fsdpmon.scrape.sources.targets import TargetsSource

        return TargetsSource(_split(args.targets), timeout_s=args.timeout)
    if args.prometheus:
        from fsdpmon.scrape.sources.prometheus import PrometheusSource

        return PrometheusSource(args.prometheus, job_name=args.job or "", timeout_s=args.timeout)
    if args.job or args.selector:
        from fsdpmon.scrape.sources.kube import KubeSource, KubeSourceConfig

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
