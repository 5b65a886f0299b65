"""`fsdpmon report --prometheus URL --job A,B` against a real Prometheus.

The monitor's series for two simulated jobs (1 and 2 ranks, known rates) are written as
OpenMetrics, backfilled into a TSDB with `promtool tsdb create-blocks-from openmetrics`, and
served by a real `prometheus` on a free loopback port; the report's range queries must recover
the rates that were put in.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time

import pytest
from prometheus_stack import run_prometheus
from support import free_port, rounded

from fsdpmon.errors import UnreachableError
from fsdpmon.report.prometheus import PrometheusAPI
from fsdpmon.scrape.expfmt import parse
from fsdpmon.scrape.sources.prometheus import PrometheusSource

# quiet: its processes mostly wait (11.2 s, 4.8 s alone, /usr/bin/time, 2-core VM)
pytestmark = pytest.mark.quiet

needs_prometheus = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="needs Debian's prometheus and promtool (scripts/setup.sh --test installs them)",
)

SCRAPE_S = 2
TOKENS_PER_STEP = 1024
JOBS = {  # job -> (world size, steady step time in seconds)
    "scale-1": (1, 0.50),
    "scale-2": (2, 0.55),
}
WARMUP_STEP_TIME_S = 2.0  # the first log window (steps 1-5) is slow, like a real start-up
LOG_EVERY = 5
END_S = 200  # the series run this long: scrapes at SCRAPE_S, 2 * SCRAPE_S, ... before it
# The report measures from the first logged window's end (the warm-up's last step, at
# LOG_EVERY x WARMUP_STEP_TIME_S, on a scrape) to the last scrape; the counter there counts
# whole steps, so it lags that time by less than one step: the rate is low by less than
# step time / SPAN_S.
SPAN_S = (END_S - SCRAPE_S) - LOG_EVERY * WARMUP_STEP_TIME_S


def rank_series(job: str, rank: int, world: int, step_time: float, t0: int) -> dict[str, list]:
    """family -> [(labels, value, unix time)], as the monitor would expose them when scraped."""
    done = [WARMUP_STEP_TIME_S * min(i, LOG_EVERY) + step_time * max(0, i - LOG_EVERY)
            for i in range(1, 400)]  # completion time of step i+1, seconds after start
    labels = f'job_name="{job}",rank="{rank}",local_rank="{rank}"'
    out: dict[str, list] = {name: [] for name in (
        "fsdpmon_train_step", "fsdpmon_train_tokens_total", "fsdpmon_train_tokens_per_second",
        "fsdpmon_train_step_time_seconds", "fsdpmon_train_process_rss_bytes",
        "fsdpmon_train_info", "fsdpmon_job_world_size")}
    for tau in range(SCRAPE_S, END_S, SCRAPE_S):
        t = t0 + tau
        step = sum(1 for c in done if c <= tau)
        out["fsdpmon_train_step"].append((labels, step, t))
        out["fsdpmon_train_tokens_total"].append((labels, step * TOKENS_PER_STEP, t))
        out["fsdpmon_train_process_rss_bytes"].append((labels, 4e8 + rank * 1e6, t))
        info = f'{labels},model="tiny",world_size="{world}",nodes="1",device="cpu"'
        out["fsdpmon_train_info"].append((info, 1, t))
        if rank == 0:
            out["fsdpmon_job_world_size"].append((f'job_name="{job}"', world, t))
        logged = step - step % LOG_EVERY
        if logged >= LOG_EVERY:
            window = done[logged - 1] - (done[logged - 1 - LOG_EVERY] if logged > LOG_EVERY else 0)
            out["fsdpmon_train_tokens_per_second"].append(
                (labels, LOG_EVERY * TOKENS_PER_STEP / window, t))
            out["fsdpmon_train_step_time_seconds"].append((labels, window / LOG_EVERY, t))
    return out


def openmetrics(t0: int) -> str:
    families: dict[str, list] = {}
    for job, (world, step_time) in JOBS.items():
        for rank in range(world):
            for name, samples in rank_series(job, rank, world, step_time, t0).items():
                families.setdefault(name, []).append(samples)
    lines = []
    for name, per_series in families.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        lines.append(f"# TYPE {name.removesuffix('_total')} {kind}")
        for samples in per_series:  # each series' samples together, in time order
            lines += [f"{name}{{{labels}}} {value} {t}" for labels, value, t in samples]
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    root = tmp_path_factory.mktemp("prom")
    t0 = int(time.time()) - 2 * 3600
    (root / "in.om").write_text(openmetrics(t0))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "in.om"),
                    str(root / "data")], check=True, capture_output=True, timeout=60)
    config = {"global": {"scrape_interval": "1h"}}
    with run_prometheus(root, config, tsdb=root / "data") as prom:
        yield prom.url


def fsdpmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fsdpmon.cli", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_prometheus
def test_report_recovers_the_rates_put_into_prometheus(prometheus, tmp_path):
    done = fsdpmon("report", "--prometheus", prometheus, "--job", "scale-2,scale-1",
                   "--since", "6h", "--step", "2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    runs = {r["name"]: r for r in json.loads((tmp_path / "report.json").read_text())["runs"]}
    assert list(runs) == ["scale-1", "scale-2"]  # sorted by world size
    for job, (world, step_time) in JOBS.items():
        run = runs[job]
        assert run["world_size"] == world and run["ranks_seen"] == world
        assert run["model"] == "tiny" and run["memory_source"] == "rss"
        # warm-up left out: the steady rate, not the start-up's
        steady = world * TOKENS_PER_STEP / step_time
        lag = step_time / SPAN_S
        assert steady * (1 - lag) <= run["tokens_per_second"] <= steady, (run, steady, lag)
        # a window's step time is (done[i] - done[i - LOG_EVERY]) / LOG_EVERY: a few roundings
        assert run["step_time_median_s"] == rounded(step_time, 16)
        assert run["peak_memory_bytes_per_gpu"] == 4e8 + (world - 1) * 1e6  # exact in the TSDB
    # each rate low by less than its step / SPAN_S: the ratio within those of either side
    ratio, low, high = runs["scale-2"]["scaling_efficiency"], 0.55 / SPAN_S, 0.50 / SPAN_S
    assert 0.50 / 0.55 * (1 - low) <= ratio <= 0.50 / 0.55 / (1 - high), ratio
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
    assert "scale-2" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
@needs_prometheus
def test_unknown_job_is_a_one_line_input_error(prometheus, tmp_path):
    done = fsdpmon("report", "--prometheus", prometheus, "--job", "nope", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "job 'nope': no fsdpmon_train_step series" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@needs_prometheus
def test_prometheus_errors_are_reported_not_raised(prometheus):
    with pytest.raises(UnreachableError, match="bad_data"):
        PrometheusAPI(prometheus).query_range("max(", 0, 10, 1)


def test_unreachable_prometheus_exits_3(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    done = fsdpmon("report", "--prometheus", url, "--job", "a", "--out", str(tmp_path))
    assert done.returncode == 3
    assert url in done.stderr and "Traceback" not in done.stderr


class _StandIn(http.server.BaseHTTPRequestHandler):
    """Answers every request with the class's canned (status, content type, body)."""

    reply: tuple[int, str, bytes] = (200, "application/json", b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, kind, body = self.reply
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # /federate
        self.do_POST()

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def stand_in(status: int, kind: str, body: bytes):
    handler = type("Handler", (_StandIn,), {"reply": (status, kind, body)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


MATRIX_WITH_JUNK = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
    "not a series",
    {"metric": "not labels", "values": [[1, "2"]]},
    {"metric": {"rank": "0"}, "values": [[10, "5"], ["x", "1"], [11], [12, "NaN"], None]},
]}}).encode()


@pytest.mark.parametrize(
    ("status", "kind", "body", "message"),
    [
        (200, "text/plain", b"hello", "not a Prometheus API response"),
        (503, "text/html", b"<html>down</html>", "HTTP 503"),
        (200, "application/json", b"[1, 2]", "not a Prometheus API response"),
        (422, "application/json",
         b'{"status":"error","errorType":"execution","error":"too many samples"}',
         "execution: too many samples"),
        (200, "application/json", b'{"status":"success","data":{"resultType":"vector",'
         b'"result":[]}}', "expected a matrix result"),
    ],
)
def test_bad_answers_become_one_line_errors(status, kind, body, message):
    with stand_in(status, kind, body) as url, pytest.raises(UnreachableError, match=message):
        PrometheusAPI(url, timeout_s=5).query_range("up", 0, 10, 1)


@pytest.mark.parametrize(
    ("status", "kind", "body", "message"),
    [
        (200, "text/plain", b"hello", "not a Prometheus API response"),
        (503, "text/html", b"<html>down</html>", "HTTP 503 Service Unavailable"),
        (400, "application/json",
         b'{"status":"error","errorType":"bad_data","error":"parse error at char 5"}',
         "bad_data: parse error at char 5"),
        (200, "application/json", b'{"status":"success","data":{"resultType":"vector"}}',
         "answer has no result list"),
    ],
)
def test_tops_source_reads_bad_answers_as_the_report_does(status, kind, body, message):
    """One client of Prometheus' API: `top --prometheus` asks it instant queries and gets the
    same one-line errors, naming the server."""
    with stand_in(status, kind, body) as url:
        with pytest.raises(UnreachableError) as raised:
            PrometheusSource(url, timeout_s=5).fetch()
        assert str(raised.value) == f"Prometheus at {url}: {message}"
        with pytest.raises(UnreachableError, match=f"^Prometheus at {url}: "):
            PrometheusAPI(url, timeout_s=5).query_range("up", 0, 10, 1)


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (400, b"bad_data: 1:12: parse error: unexpected end of input\n",
         "/federate answered HTTP 400 Bad Request: bad_data: 1:12: parse error: unexpected end"),
        (503, b"", "/federate answered HTTP 503 Service Unavailable"),
    ],
)
def test_a_refused_federation_is_one_line(status, body, message):
    """/federate explains a refusal in plain text, not JSON: its first line is the error."""
    with stand_in(status, "text/plain", body) as url, pytest.raises(UnreachableError) as raised:
        PrometheusAPI(url, timeout_s=5).federate(["{job=~'x'}"])
    assert str(raised.value).startswith(f"Prometheus at {url}: {message}"), str(raised.value)


@pytest.mark.parametrize(
    ("served", "labels"),
    [
        # VictoriaMetrics 1.79 writes label values as JSON strings (tests/test_victoria_query.py)
        (rb'm{site="train.py:3 in \u003cmodule>",q="it\u0027s"} 1 17', {
            "site": "train.py:3 in <module>", "q": "it's"}),
        (rb'm{q="\u0022\u005c\u000a"} 1', {"q": '"\\\n'}),  # the format's own escapes
        # Prometheus': a backslash escaped, then the letters u003c, stays as it was
        (rb'm{q="a\\u003c"} 1', {"q": "a\\u003c"}),
    ],
)
def test_federated_label_values_read_as_written(served, labels):
    with stand_in(200, "text/plain", served + b"\n") as url:
        got = parse(PrometheusAPI(url, timeout_s=5).federate(["m"]))
    assert [(s.name, s.labels, s.value) for s in got] == [("m", labels, 1.0)], got


def test_malformed_points_are_skipped_not_fatal():
    from fsdpmon.report.prometheus import _per_rank

    with stand_in(200, "application/json", MATRIX_WITH_JUNK) as url:
        assert _per_rank(PrometheusAPI(url), "fsdpmon_train_step", "j", (0, 20, 1)) == {
            0: {10.0: 5.0}}
