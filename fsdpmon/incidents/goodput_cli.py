"""`fsdpmon goodput`: where a run's wall-clock time went (productive time, badput by cause).

    fsdpmon goodput runs/llama/run.jsonl runs/llama-2/ [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.job.goodput import CATEGORIES
from fsdpmon.job.run_goodput import Goodput, goodput
from fsdpmon.job.runlog import RunLog, load_run
from fsdpmon.scrape.options import add_runs_arg


def configure(parser: argparse.ArgumentParser) -> None:
    add_runs_arg(parser, "+")
    parser.add_argument("--json", action="store_true",
                        help="print {\"wall_seconds\", \"productive_seconds\", "
                        "\"goodput_ratio\", \"badput_seconds\": {cause: seconds}}; for several "
                        "runs {\"runs\": [{\"run\", ...}]}")


def _culprits(gp: Goodput, run: RunLog, cause: str) -> str:
    ranks = gp.by_rank.get(cause, {})
    top = sorted(ranks.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"rank {r} ({run.ranks.get(r, {}).get('node') or '?'}) {s:.1f}s"
                     for r, s in top)


def table(gp: Goodput, run: RunLog) -> str:
    ratio = gp.goodput_ratio
    lines = [f"{run.name}: wall {gp.wall_seconds:.1f} s, productive {gp.productive_seconds:.1f} s"
             f", goodput {'-' if ratio is None else f'{ratio:.1%}'}",
             f"  {'cause':<20} {'seconds':>10} {'share':>7}  where"]
    for cause in CATEGORIES:
        seconds = gp.badput_seconds[cause]
        share = seconds / gp.wall_seconds if gp.wall_seconds > 0 else 0.0
        lines.append(f"  {cause:<20} {seconds:>10.1f} {share:>7.1%}  {_culprits(gp, run, cause)}")
    return "\n".join(lines)


def as_json(gp: Goodput, run: RunLog) -> dict[str, Any]:
    return {"run": run.name, **gp.as_json()}


def run(args: argparse.Namespace) -> int:
    runs = [load_run(path) for path in args.runs]
    figures = [(goodput(r, run_stragglers(r)), r) for r in runs]
    if args.json:
        doc: dict[str, Any] = (figures[0][0].as_json() if len(figures) == 1
                               else {"runs": [as_json(g, r) for g, r in figures]})
        print(json.dumps(doc, indent=2))
    else:
        print("\n\n".join(table(g, r) for g, r in figures))
    return 0
