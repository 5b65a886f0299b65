"""`fsdpmon report`: compare runs of one job at several sizes (table, chart, JSON).

    fsdpmon report runs/n1.jsonl runs/n2.jsonl runs/n4.jsonl --out report/
    fsdpmon report --prometheus http://prometheus:9090 --job llama-1node,llama-2node --since 7d

The chart needs matplotlib (`pip install 'fsdpmon[report]'`); without it the table and the JSON
are still written and one line says how to get the chart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.report.loader import load_runs
from fsdpmon.report.model import RunData, RunStats
from fsdpmon.report.prometheus import MAX_POINTS, load_job
from fsdpmon.report.stats import run_stats, with_scaling
from fsdpmon.report.table import markdown_report, markdown_table
from fsdpmon.scrape.options import add_history_args, add_runs_arg, history_api, history_jobs

NO_CHART = "no chart: matplotlib is not installed (pip install 'fsdpmon[report]' to draw it)"


def configure(parser: argparse.ArgumentParser) -> None:
    add_runs_arg(parser, "*", directory="a directory of runs' logs")
    parser.add_argument("--out", default="fsdpmon-report", metavar="DIR",
                        help="directory for report.md, report.json and scaling.png (the chart "
                        "needs matplotlib: pip install 'fsdpmon[report]') (default: %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                        help="leave steps <= N out of the figures (default: each rank's first "
                        "log window, which holds start-up)")
    # --jobs A,B was this flag's name before --job was one flag for every command
    add_history_args(parser, "reading jobs from Prometheus", renamed=("--jobs",), until=True,
                     step=f"the job's duration / {MAX_POINTS}, at least 0.1 s")


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


def collect(args: argparse.Namespace) -> list[RunData]:
    """Every run the arguments name: JSONL logs first, then Prometheus jobs."""
    jobs = history_jobs(args)
    if not args.runs and not jobs:
        raise ConfigError("RUN", "name at least one run log, or --prometheus URL --job A,B")
    if not jobs:
        return load_runs(args.runs)
    until = parse_time("--until", args.until)
    api, since = history_api(args, until)  # every flag checked before the logs are read
    return load_runs(args.runs) + [load_job(api, job, since, until, args.step) for job in jobs]


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
