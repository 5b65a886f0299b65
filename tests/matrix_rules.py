"""The shipped rules over the recorded matrix: `promtool test rules` over the series each
recording's scrapes would have given Prometheus (tests/matrix_prometheus.py's `scraped`), laid
on promtool's 1 s grid, every alert that was pending or firing at any moment read back from
``ALERTS``.

On the grid, a series has at each second its value in the last scrape before it, and a
staleness marker once a scrape came without it (as a live scrape writes). promtool's clock
starts at 0, so every value that is a unix time (``*_timestamp_seconds``,
``*_start_time_seconds``) is moved by the grid's start, and ``time() - x`` reads as it did live.
An alert counts once firing, or once its condition has held (pending) as long as the judge's
evidence window, DIAGNOSIS_EVIDENCE_SECONDS: the rules' `for` (up to 15 min) is longer than
any recording, and what this door is asked is whether the rules' condition names the judge's
cause and rank, held as long as the judge holds its evidence.
"""

from __future__ import annotations

import bisect
import math
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from matrix_doors import Named, Recording
from matrix_prometheus import scraped

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.dashboards.generate import rules_yaml

TIMES = ("_timestamp_seconds", "_start_time_seconds")
# Every alert firing at some moment (one without `for` fires at once), and every pending one
# whose condition held as long as the judge's evidence window (ALERTS_FOR_STATE: since when).
HELD = (f'last_over_time(ALERTS{{alertstate="firing"}}[1d]) or max_over_time(('
        f'timestamp(ALERTS_FOR_STATE) - ALERTS_FOR_STATE)[1d:1s]) >= {DIAGNOSIS_EVIDENCE_SECONDS}')
GOT = re.compile(r"\{([^{}]*)\} ")
PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
SECTION = re.compile(r"^Unit Testing:\s+(\S+)", re.M)


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return ("+Inf" if v > 0 else "-Inf") if math.isinf(v) else repr(v)


def test_file(rec: Recording) -> dict:
    """The promtool unit test of one recording: its series on a 1 s grid, and one expression
    listing every alert it raised."""
    t0 = math.floor(rec.frames[0]["t"])
    times = [f["t"] for f in rec.frames]
    grid = range(math.ceil(times[-1] - t0) + 1)
    latest = [bisect.bisect_right(times, t0 + s) - 1 for s in grid]  # frame index, or -1
    series = []
    for name, by_labels in scraped(rec).items():
        shift = t0 if name.endswith(TIMES) else 0.0
        for labels, points in by_labels.items():
            at = dict(points)
            values, seen = [], False
            for f in latest:
                v = at.get(times[f]) if f >= 0 else None
                if v is not None:
                    values.append(_value(v - shift))
                    seen = True
                else:
                    values.append("stale" if seen and values[-1] not in ("stale", "_")
                                  else "_")
            series.append({"series": f"{name}{{{labels}}}", "values": " ".join(values)})
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1s",
            "tests": [{"interval": "1s", "input_series": series,
                       "promql_expr_test": [{"expr": HELD,
                                             "eval_time": f"{len(grid) - 1}s",
                                             "exp_samples": []}]}]}


def rules_alerts(recs: list[Recording], workdir: Path) -> dict[str, Named]:
    """slug -> the (cause, rank) of every alert the rules raised over that recording (rank
    None for an alert without one)."""
    (workdir / "rules.yaml").write_text(rules_yaml())
    files = []
    for rec in recs:
        path = workdir / f"{rec.slug}.test.yaml"
        path.write_text(yaml.safe_dump(test_file(rec), width=1 << 20))
        files.append(path)
    done = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules",
                           *map(str, files)], cwd=workdir, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    text = done.stdout
    if "error" in text.lower() and "FAILED" not in text:
        raise AssertionError(f"promtool could not run the tests:\n{text[-3000:]}")
    out: dict[str, Named] = {rec.slug: set() for rec in recs}
    heads = list(SECTION.finditer(text))
    for i, head in enumerate(heads):
        body = text[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        slug = Path(head.group(1)).name.removesuffix(".test.yaml")
        for match in GOT.finditer(body.split("got:", 1)[-1] if "got:" in body else ""):
            labels = dict(PAIR.findall(match.group(1)))
            rank = labels.get("rank")
            out[slug].add((labels.get("cause", labels.get("alertname", "?")),
                           None if rank is None else int(rank)))
    return out
