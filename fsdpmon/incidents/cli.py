"""`fsdpmon incidents`: what went wrong in a run, when, on which rank/pod/node/GPU, and what it
cost in GPU-seconds; nodes that keep appearing as culprits across runs ("lemon nodes").

    fsdpmon incidents runs/llama/run.jsonl runs/llama-2/ [--json]
    fsdpmon incidents --prometheus http://prometheus:9090 --job llama2-7b --since 24h
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.errors import ConfigError
from fsdpmon.incidents.history import job_incidents
from fsdpmon.incidents.incidents import Incident, incidents, lemon_nodes
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import load_run
from fsdpmon.scrape.options import add_history_args, add_runs_arg, history_api, history_jobs

MAX_POINTS = 2000  # per range query: Prometheus refuses more than 11,000


def configure(parser: argparse.ArgumentParser) -> None:
    add_runs_arg(parser, "*")
    parser.add_argument("--json", action="store_true",
                        help='print {"incidents": [{"start", "end", "cause", "rank", "pod", '
                        '"node", "gpu", "evidence", "lost_gpu_seconds"}]}')
    parser.add_argument("--lemon-runs", type=int, default=2, metavar="N",
                        help="list nodes named as culprits in at least N runs or jobs")
    add_history_args(parser, "reading a job's history from Prometheus",
                     step=f"the range / {MAX_POINTS}, at least 1 s")


def collect(args: argparse.Namespace) -> list[Incident]:
    jobs = history_jobs(args)
    if not args.runs and not jobs:
        raise ConfigError("RUN", "name at least one run's JSONL, or --prometheus URL --job NAME")
    if args.lemon_runs < 1:
        raise ConfigError("--lemon-runs", f"must be >= 1, got {args.lemon_runs}")
    if not jobs:
        return _from_logs(args.runs)
    end = time.time()
    api, start = history_api(args, end)  # every flag checked before the logs are read
    step = args.step or max(1.0, (end - start) / MAX_POINTS)
    return _from_logs(args.runs) + [
        found for job in jobs for found in job_incidents(api, job, start, end, step)]


def _from_logs(paths: list[str]) -> list[Incident]:
    found: list[Incident] = []
    for path in paths:
        run = load_run(path)
        found += incidents(run, goodput(run, run_stragglers(run)))
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
