"""`fsdpmon incidents`: what went wrong in a run, when, on which rank/pod/node/GPU, and what it
cost in GPU-seconds; nodes that keep appearing as culprits across runs ("lemon nodes").

    fsdpmon incidents runs/llama/run.jsonl runs/llama-2/ [--json]
    fsdpmon incidents --prometheus http://prometheus:9090 --job llama2-7b --since 24h
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime, timezone

from fsdpmon.errors import ConfigError
from fsdpmon.incidents.history import job_incidents
from fsdpmon.incidents.incidents import Incident, incidents, lemon_nodes
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import load_run
from fsdpmon.scrape.prometheus_api import PrometheusAPI

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_POINTS = 2000  # per range query: Prometheus refuses more than 11,000


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN",
                        help="a run's JSONL: the trainer's --log-jsonl PATH (its per-rank files "
                        "PATH.rank<k>.jsonl are read), one per-rank file, or their directory")
    parser.add_argument("--json", action="store_true",
                        help='print {"incidents": [{"start", "end", "cause", "rank", "pod", '
                        '"node", "gpu", "evidence", "lost_gpu_seconds"}]}')
    parser.add_argument("--lemon-runs", type=int, default=2, metavar="N",
                        help="list nodes named as culprits in at least N runs or jobs")
    prom = parser.add_argument_group("reading a job's history from Prometheus")
    prom.add_argument("--prometheus", metavar="URL", help="Prometheus base URL")
    prom.add_argument("--job", action="append", default=[], metavar="NAME",
                      help="job name (the job_name label); repeat for several jobs")
    prom.add_argument("--since", default="24h", metavar="DURATION",
                      help="how far back to look, e.g. 90m, 24h, 7d")
    prom.add_argument("--step", type=float, default=None, metavar="SECONDS",
                      help="query resolution (default: the range / 2000, at least 1 s)")
    prom.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                      help="HTTP timeout per query")


def duration(flag: str, text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match or float(match[1]) <= 0:
        raise ConfigError(flag, f"{text!r} is not a duration like 90s, 30m, 24h or 7d")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def collect(args: argparse.Namespace) -> list[Incident]:
    if bool(args.job) != bool(args.prometheus):
        raise ConfigError("--job" if args.prometheus else "--prometheus",
                          "--prometheus and --job go together")
    if not args.runs and not args.job:
        raise ConfigError("RUN", "name at least one run's JSONL, or --prometheus URL --job NAME")
    if args.lemon_runs < 1:
        raise ConfigError("--lemon-runs", f"must be >= 1, got {args.lemon_runs}")
    found: list[Incident] = []
    for path in args.runs:
        run = load_run(path)
        found += incidents(run, goodput(run))
    if args.job:
        if args.step is not None and not args.step > 0:
            raise ConfigError("--step", f"must be > 0 seconds, got {args.step!r}")
        if not args.timeout > 0:
            raise ConfigError("--timeout", f"must be > 0 seconds, got {args.timeout!r}")
        api = PrometheusAPI(args.prometheus, timeout_s=args.timeout)
        end = time.time()
        span = duration("--since", args.since)
        step = args.step or max(1.0, span / MAX_POINTS)
        for job in args.job:
            found += job_incidents(api, job, end - span, end, step)
    return found


def _when(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def text(found: list[Incident], lemons: list[tuple[str, int, float]]) -> str:
    if not found:
        return "no incidents"
    lines = []
    for inc in found:
        where = ", ".join(f"{k} {v}" for k, v in (("rank", inc.rank), ("pod", inc.pod),
                                                   ("node", inc.node), ("gpu", inc.gpu)) if v
                          not in (None, ""))
        lines.append(f"{_when(inc.start)} → {_when(inc.end)} UTC  {inc.cause:<18} "
                     f"{where or 'culprit unknown'}  lost {inc.lost_gpu_seconds:.0f} GPU-s"
                     f"{'  [' + inc.run + ']' if inc.run else ''}")
        lines += [f"    {line}" for line in inc.evidence]
    if lemons:
        lines.append("\nlemon nodes (culprits in several runs):")
        lines += [f"  {node}: {runs} runs, {lost:.0f} GPU-s lost" for node, runs, lost in lemons]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    found = collect(args)
    lemons = lemon_nodes(found, args.lemon_runs)
    if args.json:
        print(json.dumps({"incidents": [i.as_json() for i in found]}, indent=2))
    else:
        print(text(found, lemons))
    return 0
