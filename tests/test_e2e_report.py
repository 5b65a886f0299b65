"""End to end: train `tiny` at world sizes 1 and 2 on CPU with the real trainer, then report.

The table's tokens/s and step times must agree with figures this test recomputes from the raw
JSONL records; the chart must be a valid PNG; damaged logs must give one-line errors. A real
Prometheus scrapes both runs as they train, and `--prometheus --job` must tell the same story.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from proc_tree import kill_tree
from prometheus_stack import run_prometheus
from support import free_port, printed, rounded

from fsdpmon.faultspec import ENV_VAR as FAULT
from fsdpmon.monitor.server import RENDER_SECONDS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# Read back from Prometheus, tokens/s is tokens between two evaluation times, each end off by
# up to a log window, a scrape and the endpoint's rendering age (the bound is derived in the
# test): the error shrinks with the run's span. Every rank's loader waits DATA_WAIT_S a batch
# (the data-slow fault), so the span is at least STEPS x DATA_WAIT_S (15 s) on any machine
# while the ranks mostly sleep, and the data-wait column has something to agree on.
STEPS, LOG_EVERY = 100, 5
DATA_WAIT_S = 0.15
SCRAPE_S = 0.25
HAVE_PROMETHEUS = bool(shutil.which("prometheus"))


def train(world_size: int, log: Path, port: int) -> float:
    """Train to the end; when torchrun exited (unix seconds)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={world_size}", "-m", "fsdpmon.trainer.train", "--model", "tiny",
        "--max-steps", str(STEPS), "--log-every", str(LOG_EVERY), "--batch-size", "4",
        "--seq-len", "64", "--metrics-port", str(port), "--log-jsonl", str(log),
        "--job-name", log.name.removesuffix(".jsonl"),
    ]
    waits = ";".join(f"data-slow:rank={r},seconds={DATA_WAIT_S}" for r in range(world_size))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
           FAULT: waits}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        kill_tree(proc)  # torchrun's workers too, if anything hung
    assert proc.returncode == 0, output[-3000:]
    return time.time()


@contextlib.contextmanager
def prometheus_scraping(ports: list[int], root: Path):
    """A real Prometheus scraping the training endpoints every 250 ms; yields its URL.

    It yields only once every target has been tried: a short run could otherwise end before
    its first scrape."""
    if not HAVE_PROMETHEUS:
        yield None
        return
    config = {"global": {"scrape_interval": f"{SCRAPE_S * 1000:.0f}ms",
                         "scrape_timeout": "200ms"},
              "scrape_configs": [{"job_name": "train", "static_configs": [
                  {"targets": [f"127.0.0.1:{p}" for p in ports]}]}]}
    with run_prometheus(root, config, tsdb=root / "tsdb", await_targets=True) as prom:
        yield prom.url


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(directory of the two runs' logs, URL of the Prometheus that scraped them or None,
    run name -> when its torchrun exited, unix seconds)."""
    root = tmp_path_factory.mktemp("runs")
    ports = [free_port(), free_port()]
    with prometheus_scraping(ports, root) as url:
        # Side by side: the one-rank run's start-up and steps hide under the two-rank run's
        # (every figure checked is its own run's, from its logs or its scrapes).
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {f"tiny-n{n}": pool.submit(train, n, root / f"tiny-n{n}.jsonl", port)
                       for n, port in zip((1, 2), ports, strict=True)}
        ended = {name: future.result() for name, future in futures.items()}
        if url is not None:  # the last scrapes have landed once both endpoints read as gone
            deadline = time.monotonic() + 60
            while instant(url, 'max(up{job="train"})') != 0.0:
                assert time.monotonic() < deadline, "Prometheus still scrapes a finished run"
                time.sleep(SCRAPE_S)
        yield root, url, ended


def instant(url: str, query: str) -> float | None:
    """An instant query's one value (None when empty)."""
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": query}), timeout=10) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def recomputed(root: Path, name: str) -> dict[str, float]:
    """The report's figures, recomputed from the records without fsdpmon's code."""
    rates, step_times, waits, world_size = [], [], [], None
    for path in sorted(root.glob(f"{name}.rank*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        world_size = records[0]["world_size"]
        steps = [r for r in records if r["kind"] == "step"]
        assert [r["step"] for r in steps] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
        warm, last = steps[0], steps[-1]  # the first log window is start-up
        rates.append((last["tokens_total"] - warm["tokens_total"]) / (last["time"] - warm["time"]))
        step_times += [r["step_time_s"] for r in steps[1:]]
        waits += [r["data_wait_ratio"] for r in steps[1:]]
    assert world_size is not None and len(rates) == world_size
    return {
        "total": float(np.mean(rates)) * world_size,
        "per_gpu": float(np.mean(rates)),
        "median": float(np.percentile(step_times, 50)),
        "p90": float(np.percentile(step_times, 90)),
        "data_wait_percent": float(np.mean(waits)) * 100,
    }


def fsdpmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsdpmon.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_agrees_with_the_logs(runs, tmp_path):
    runs, _, _ = runs
    out = tmp_path / "report"
    done = fsdpmon("report", str(runs / "tiny-n2.jsonl"), str(runs / "tiny-n1.jsonl"),
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    table = (out / "report.md").read_text()
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| `")}
    assert list(rows) == ["tiny-n1", "tiny-n2"]
    for name, cells in rows.items():
        want = recomputed(runs, name)
        assert int(cells[0]) == int(name[-1])  # GPUs
        assert float(cells[2].replace(",", "")) == printed(want["total"], 1)
        assert float(cells[3].replace(",", "")) == printed(want["per_gpu"], 1)
        assert float(cells[4]) == printed(want["median"], 4)
        assert float(cells[5]) == printed(want["p90"], 4)
        assert cells[6] == "n/a"  # MFU: no peak FLOP/s for a CPU
        assert float(cells[7].rstrip("%")) == printed(want["data_wait_percent"], 1)
        assert want["data_wait_percent"] > 0, f"{name}: no data wait in the logs"  # DATA_WAIT_S
    assert rows["tiny-n1"][9] == "100.0%"  # scaling efficiency
    summary = json.loads((out / "report.json").read_text())
    for run, name in zip(summary["runs"], rows, strict=True):  # goodput beside throughput
        assert 0 < run["goodput_ratio"] <= 1 and set(run["badput_seconds"]) >= {"startup"}
        assert rows[name][-1] == f"{run['goodput_ratio'] * 100:.1f}%", (rows[name], run)
    n2 = summary["runs"][1]
    assert n2["scaling_efficiency"] == rounded(  # one division, of the JSON's own figures
        n2["tokens_per_second_per_gpu"] / summary["runs"][0]["tokens_per_second_per_gpu"], 1)
    with Image.open(out / "scaling.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] >= 1200


def test_directory_of_runs_is_one_argument(runs, tmp_path):
    runs, _, _ = runs
    done = fsdpmon("report", str(runs), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [r["world_size"] for r in json.loads((tmp_path / "report.json").read_text())["runs"]] \
        == [1, 2]


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("missing", "no such log"),
        ("empty", "empty log"),
        ("corrupt", ":2: not a JSON record"),
    ],
)
def test_damaged_logs_give_one_line_errors(runs, tmp_path, damage, needle):
    runs, _, _ = runs
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in runs.glob("tiny-n2.rank*.jsonl"):
        (copy / path.name).write_text(path.read_text())
    target = copy / "tiny-n2.rank1.jsonl"
    if damage == "missing":
        target = copy / "tiny-n3.jsonl"
    elif damage == "empty":
        target.write_text("")
    else:
        lines = target.read_text().splitlines(keepends=True)
        # not a record at all (a torn one is skipped with a warning: tests/test_report.py)
        target.write_text(lines[0] + "garbage\n" + "".join(lines[2:]))
    arg = copy / ("tiny-n3.jsonl" if damage == "missing" else "tiny-n2.jsonl")
    done = fsdpmon("report", str(arg), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert needle in done.stderr and str(target) in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not HAVE_PROMETHEUS, reason="needs Debian's prometheus")
def test_prometheus_source_tells_the_same_story_as_the_logs(runs, tmp_path):
    """The same two runs, read back from the Prometheus that scraped their monitors."""
    root, url, ended = runs
    from_logs = fsdpmon("report", str(root), "--out", str(tmp_path / "logs"))
    from_prom = fsdpmon("report", "--prometheus", url, "--job", "tiny-n1,tiny-n2",
                        "--since", "1h", "--out", str(tmp_path / "prom"))
    assert from_logs.returncode == 0 and from_prom.returncode == 0, from_prom.stderr
    logs, prom = (json.loads((tmp_path / d / "report.json").read_text())["runs"]
                  for d in ("logs", "prom"))
    for a, b in zip(logs, prom, strict=True):
        assert (a["world_size"], a["ranks_seen"], a["model"], a["memory_source"]) == \
            (b["world_size"], b["ranks_seen"], b["model"], b["memory_source"]), (a, b)
        steps = [[r for r in read(p) if r["kind"] == "step"]
                 for p in sorted(root.glob(f"{a['name']}.rank*.jsonl"))]
        times = [[r["time"] for r in rank] for rank in steps]
        span = min(t[-1] - t[0] for t in times)  # what the logs' rate divides by
        windows = [y - x for t in times for x, y in itertools.pairwise(t)]
        exit_s = ended[a["name"]] - max(t[-1] for t in times)  # last log -> endpoint gone
        # the report's query resolution: ~1000 points over the run, no finer than 0.1 s
        step = max(0.1, span / 1000 + 0.05)
        # Prometheus sees each log window's figures from when a scrape (every SCRAPE_S) finds
        # the endpoint's rendering (at most RENDER_SECONDS old) until the next window's, on an
        # evaluation grid of `step`. Its first measured point comes up to a window, a
        # rendering, a scrape and two grid steps after the logs' first; its last, up to the
        # process's exit, a scrape and two grid steps after the logs' last. The tokens between
        # them are logged figures, so only the span differs.
        early = max(windows) + RENDER_SECONDS + SCRAPE_S + 2 * step
        late = exit_s + SCRAPE_S + 2 * step
        ratio = b["tokens_per_second"] / a["tokens_per_second"]
        assert span / (span + late) <= ratio <= span / (span - early), (
            f"{a['name']}: {b['tokens_per_second']:.1f} vs {a['tokens_per_second']:.1f} tok/s "
            f"(x{ratio:.4f}); span {span:.2f}s, first point up to {early:.2f}s late, last up "
            f"to {late:.2f}s")
        # Each window's step time is sampled once per grid step while it is served: between
        # `fewest` and `most` times. The median of such a weighted sample lies between the
        # logged step times' 50 x fewest / most and 100 - that percentiles.
        fewest = max(0, math.floor((min(windows) - SCRAPE_S - RENDER_SECONDS) / step))
        most = math.ceil((max(*windows, exit_s) + SCRAPE_S + RENDER_SECONDS) / step) + 1
        edge = 50 * fewest / most
        logged = [r["step_time_s"] for rank in steps for r in rank[1:]]
        low, high = np.percentile(logged, edge), np.percentile(logged, 100 - edge)
        assert low <= b["step_time_median_s"] <= high, (
            f"{a['name']}: median {b['step_time_median_s']:.4f}s outside the logged step "
            f"times' {edge:.0f}..{100 - edge:.0f} percentiles {low:.4f}..{high:.4f}s")
        # a sampled peak is one of the figures the monitor logged, and no higher than their max
        rss = {r["peak_memory_bytes"] for rank in steps for r in rank}
        assert b["peak_memory_bytes_per_gpu"] in rss, (b["peak_memory_bytes_per_gpu"], rss)
        assert b["peak_memory_bytes_per_gpu"] <= a["peak_memory_bytes_per_gpu"], (a, b)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
