"""`fsdpmon report`: compare runs of one job at several sizes (table, chart, JSON).

    fsdpmon report runs/n1.jsonl runs/n2.jsonl runs/n4.jsonl --out report/
    fsdpmon report --prometheus http://prometheus:9090 --jobs llama-1node,llama-2node --since 7d

The chart needs matplotlib (`pip install 'fsdpmon[report]'`); without it the table and the JSON
are still written and one line says how to get the chart.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.report.loader import load_runs
from fsdpmon.report.model import RunData, RunStats
from fsdpmon.report.prometheus import PrometheusAPI, load_job
from fsdpmon.report.stats import run_stats, with_scaling
from fsdpmon.report.table import markdown_report, markdown_table

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
NO_CHART = "no chart: matplotlib is not installed (pip install 'fsdpmon[report]' to draw it)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs", nargs="*", metavar="RUN",
        help="a run's JSONL log (the trainer's --log-jsonl PATH; its per-rank files "
        "PATH.rank<k>.jsonl are read), one per-rank file, or a directory of runs' logs",
    )
    parser.add_argument("--out", default="fsdpmon-report", metavar="DIR",
                        help="directory for report.md, report.json and scaling.png (the chart "
                        "needs matplotlib: pip install 'fsdpmon[report]') (default: %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                        help="leave steps <= N out of the figures (default: each rank's first "
                        "log window, which holds start-up)")
    prom = parser.add_argument_group("reading jobs from Prometheus")
    prom.add_argument("--prometheus", metavar="URL", help="Prometheus base URL")
    prom.add_argument("--jobs", metavar="A,B",
                      help="job names (the job_name label), comma-separated")
    prom.add_argument("--since", default="24h", metavar="DURATION",
                      help="how far back to look for the jobs, e.g. 90m, 24h, 7d (default: 24h)")
    prom.add_argument("--until", default=None, metavar="TIME",
                      help="end of the search range: unix seconds or ISO 8601 (default: now)")
    prom.add_argument("--step", type=float, default=None, metavar="SECONDS",
                      help="query resolution (default: the job's duration / 1000, at least 0.1 s)")
    prom.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                      help="HTTP timeout per query (default: 30)")


def parse_duration(field: str, text: str) -> float:
    match = _DURATION.match(text.strip())
    if not match or float(match[1]) <= 0:
        raise ConfigError(field, f"{text!r} is not a duration like 90s, 30m, 24h or 7d")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


def parse_time(field: str, text: str | None) -> float:
    if text is None:
        return time.time()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(field, f"{text!r} is neither unix seconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise ConfigError(field, f"{text!r} has no time zone; add Z or +00:00")
    return moment.timestamp()


def _job_names(text: str | None) -> list[str]:
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    if text is not None and not names:
        raise ConfigError("--jobs", "give at least one job name")
    return names


def collect(args: argparse.Namespace) -> list[RunData]:
    """Every run the arguments name: JSONL logs first, then Prometheus jobs."""
    jobs = _job_names(args.jobs)
    if bool(jobs) != bool(args.prometheus):
        raise ConfigError("--jobs" if args.prometheus else "--prometheus",
                          "--prometheus and --jobs go together")
    if not args.runs and not jobs:
        raise ConfigError("RUN", "name at least one run log, or --prometheus URL --jobs A,B")
    runs = load_runs(args.runs)
    if jobs:
        for flag, value in (("--step", args.step), ("--timeout", args.timeout)):
            if value is not None and not value > 0:
                raise ConfigError(flag, f"must be > 0 seconds, got {value!r}")
        api = PrometheusAPI(args.prometheus, timeout_s=args.timeout)
        until = parse_time("--until", args.until)
        since = until - parse_duration("--since", args.since)
        runs += [load_job(api, job, since, until, args.step) for job in jobs]
    return runs


def run(args: argparse.Namespace) -> int:
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise ConfigError("--warmup-steps", f"must be >= 0, got {args.warmup_steps}")
    data = collect(args)
    stats = with_scaling([run_stats(run, args.warmup_steps) for run in data])
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create the output directory: {exc}") from None
    warmup = (
        "each rank's first log window left out as warm-up"
        if args.warmup_steps is None
        else f"steps after {args.warmup_steps}"
    )
    chart = _chart(stats, out / "scaling.png")
    chart_name = chart.name if chart else None
    (out / "report.md").write_text(markdown_report(stats, warmup=warmup, chart_name=chart_name))
    summary = {
        "baseline": stats[0].name,
        "warmup": warmup,
        "runs": [s.to_json() for s in stats],
    }
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(markdown_table(stats))
    written = [out / "report.md", out / "report.json", *([chart] if chart else [])]
    print("\nwrote " + ", ".join(str(path) for path in written))
    if chart is None:
        print(f"fsdpmon report: {NO_CHART}", file=sys.stderr)
    return 0


def _chart(stats: list[RunStats], path: Path) -> Path | None:
    """Draw the PNG where matplotlib (the `report` extra) is installed; None where it is not."""
    try:
        from fsdpmon.report.chart import write_chart
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        return None
    return write_chart(stats, path)
