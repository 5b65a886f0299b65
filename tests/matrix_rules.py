"""The shipped rules over the recorded matrix: `promtool test rules` over the series each
recording's scrapes would have given Prometheus (tests/matrix_prometheus.py's `scraped`), laid
on promtool's 1 s input grid and evaluated every EVALUATION; every alert that fired, or was
pending long enough, at any moment is read back from ``ALERTS`` / ``ALERTS_FOR_STATE``.

On the grid, a series has at each second its value in the last scrape before it, and a
staleness marker once a scrape came without it (as a live scrape writes). promtool's clock
starts at 0, so every value that is a unix time (``*_timestamp_seconds``,
``*_start_time_seconds``) is moved by the grid's start, and ``time() - x`` reads as it did live.
An alert counts once firing, or once its condition has held (pending) as long as the judge's
evidence window, DIAGNOSIS_EVIDENCE_SECONDS: the rules' `for` (up to 15 min) is longer than
any recording, and what this door is asked is whether the rules' condition names the judge's
cause and rank, held as long as the judge holds its evidence. Only the series some rule names
are given to promtool (the others cannot change what a rule says), two promtool processes
sharing the recordings.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from matrix_doors import Named, Recording
from matrix_prometheus import scraped

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.dashboards.generate import rules_yaml

TIMES = ("_timestamp_seconds", "_start_time_seconds")
# Every alert firing at some moment (one without `for` fires at once), and every pending one
# whose condition held as long as the judge's evidence window (ALERTS_FOR_STATE: since when).
HELD = (f'last_over_time(ALERTS{{alertstate="firing"}}[1d]) or max_over_time(('
        f'timestamp(ALERTS_FOR_STATE) - ALERTS_FOR_STATE)[1d:1s]) >= {DIAGNOSIS_EVIDENCE_SECONDS}')
EVALUATION = "2s"  # the rules' evaluation interval
PROMTOOLS = 2  # promtool processes, the recordings split between them: one a core
GOT = re.compile(r"\{([^{}]*)\} ")
PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return ("+Inf" if v > 0 else "-Inf") if math.isinf(v) else repr(v)


def test_group(rec: Recording, names: frozenset[str]) -> dict:
    """A promtool test group of one recording: its series of ``names`` on a 1 s grid, and
    one expression listing every alert it raised, labelled with the recording's slug."""
    t0 = math.floor(rec.frames[0]["t"])
    times = [f["t"] for f in rec.frames]
    grid = range(math.ceil(times[-1] - t0) + 1)
    latest = [bisect.bisect_right(times, t0 + s) - 1 for s in grid]  # frame index, or -1
    series = []
    for name, by_labels in scraped(rec).items():
        if name not in names:
            continue
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
    expr = f'label_replace(({HELD}), "recording", "{rec.slug}", "", "")'
    return {"interval": "1s", "input_series": series,
            "promql_expr_test": [{"expr": expr, "eval_time": f"{len(grid) - 1}s",
                                  "exp_samples": []}]}


def rules_alerts(recs: list[Recording], workdir: Path) -> dict[str, Named]:
    """slug -> the (cause, rank) of every alert the rules raised over that recording (rank
    None for an alert without one)."""
    rules = rules_yaml()
    (workdir / "rules.yaml").write_text(rules)
    # a series no rule names cannot change what they say: promtool is not given it
    names = frozenset(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rules))

    def run(part: int) -> str:
        path = workdir / f"matrix{part}.test.yaml"
        doc = {"rule_files": ["rules.yaml"], "evaluation_interval": EVALUATION,
               "tests": [test_group(r, names) for r in recs[part::PROMTOOLS]]}
        path.write_text(json.dumps(doc))  # JSON is YAML, and quick to write
        done = subprocess.run([shutil.which("promtool") or "promtool", "test", "rules",
                               path.name], cwd=workdir, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        if done.returncode != 0 and "got:" not in done.stdout:
            raise AssertionError(f"promtool could not run {path.name}:\n{done.stdout[-3000:]}")
        return done.stdout

    with ThreadPoolExecutor(max_workers=PROMTOOLS) as pool:
        text = "".join(pool.map(run, range(PROMTOOLS)))
    out: dict[str, Named] = {rec.slug: set() for rec in recs}
    for got in text.split("got:")[1:]:
        for match in GOT.finditer(got.split("\n", 1)[0]):
            labels = dict(PAIR.findall(match.group(1)))
            rank = labels.get("rank")
            out[labels["recording"]].add((labels.get("cause", labels.get("alertname", "?")),
                                          None if rank is None else int(rank)))
    return out
