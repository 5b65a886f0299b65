"""The page at 2,048 ranks (issue 49 item 4): stand-in pods serve the real exposition of a
256 x 8 job (tests/synthetic_job.py, as bench_top does), one rank of which hangs in its data
phase while every other rank waits for it inside the next collective. A real Prometheus scrapes
them at the shipped intervals and evaluates the shipped rule file (the culprit group at its own
10 s, the rest at kube-prometheus-stack's 30 s), and sends to a real Alertmanager on the shipped
route, which notifies a webhook of this script.

The hung job's evidence is what its monitors would publish: every rank's last step at the
hang's start, the waiting ranks inside collective N+1 since 0.3 s later with the bound they
publish (their 25 s wait floor counted from the last step), the hung rank outside, at N, with
the 120 s floor. The payloads are static: the rules' `time()` moves the clock.

Prints: seconds from the hang's start to the first notification and whom it names; every
notification received in the minute after it (one wanted); each rule group's longest evaluation
(`prometheus_rule_group_last_duration_seconds`, sampled every 5 s; goal under 2 s); the series
per rank (goal under 100); and `fsdpmon top --prometheus`'s refresh on that Prometheus
(PrometheusSource.fetch at top's default interval: p50 wall, goal 1 s) with the CPU time the
Prometheus process spent in windows of refreshes over what it spent in as long a rest after
each (goal 0.5 s a refresh), beside the same for a source that reads everything every refresh.

Not a test: figures depend on the machine. Run ``.venv/bin/python benchmarks/bench_page_scale.py
[--nodes 256 --gpus 8]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests")]

from payload_server import PayloadServer  # noqa: E402
from prometheus_stack import Webhook, alertmanager, run_prometheus  # noqa: E402
from shipped_alerts import EXPORTER_SCRAPE_S, SHIPPED_RULES, TRAINING_SCRAPE  # noqa: E402
from synthetic_job import GpuSpec, RankSpec, exporter_exposition, training_exposition  # noqa: E402

from fsdpmon import catalog  # noqa: E402
from fsdpmon import conventions as conv  # noqa: E402
from fsdpmon.manifests.alerting import alertmanager_config  # noqa: E402
from fsdpmon.scrape.sources.prometheus import PrometheusSource  # noqa: E402
from fsdpmon.scrape.sources.readcache import ReadCache  # noqa: E402
from fsdpmon.top import cli as top_cli  # noqa: E402

JOB = "llama2-70b"
SEQ = 5000  # the collective every rank completed before the hang
ENTERED_AFTER_S = 0.3  # the waiting ranks enter collective SEQ + 1 this long after the step
GLOBAL_EVALUATION = "30s"  # kube-prometheus-stack's; the culprit group sets its own 10 s
BREAK_SERIES = [m.name for m in (
    catalog.TRAIN_COLLECTIVE_BREAK_STEP, catalog.TRAIN_COLLECTIVE_BREAK_INDEX,
    catalog.TRAIN_COLLECTIVE_BREAK_OP, catalog.TRAIN_COLLECTIVE_BREAK_ELEMENTS,
    catalog.TRAIN_COLLECTIVE_BREAK_DTYPE, catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_OP,
    catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_ELEMENTS, catalog.TRAIN_COLLECTIVE_BREAK_EXPECTED_DTYPE,
    catalog.TRAIN_COLLECTIVE_BREAK_SITE_INFO)]
GOALS = {"evaluation_s": 2.0, "series_per_rank": 100, "refresh_p50_s": 1.0,
         "prometheus_cpu_per_refresh_s": 0.5}


def _rank(r: int, gpus: int, world: int, nodes: int, t0: float, hung: int | None) -> RankSpec:
    waiting = hung is not None and r != hung
    since = t0 + ENTERED_AFTER_S if waiting else t0
    bound = (since - t0 + conv.DEFAULT_STALL_WAIT_FLOOR_SECONDS if waiting
             else conv.DEFAULT_STALL_FLOOR_SECONDS)
    progress = {
        catalog.TRAIN_LAST_STEP_TIMESTAMP_SECONDS.name: t0,
        catalog.TRAIN_POSITION_SINCE_TIMESTAMP_SECONDS.name: since,
        catalog.TRAIN_COLLECTIVE_ENTERED_SEQ.name: SEQ + 1 if waiting else SEQ,
        catalog.TRAIN_COLLECTIVE_COMPLETED_SEQ.name: SEQ,
        catalog.TRAIN_IN_COLLECTIVE.name: 1.0 if waiting else 0.0,
        catalog.TRAIN_STALL_THRESHOLD_SECONDS.name: bound,
        catalog.TRAIN_STALLED.name: 0.0,
        catalog.TRAIN_COLLECTIVE_ENTERED_OP.name: 3.0,
        catalog.TRAIN_COLLECTIVE_ENTERED_ELEMENTS.name: 4096.0,
        catalog.TRAIN_COLLECTIVE_ENTERED_DTYPE.name: 1.0,
        catalog.TRAIN_COLLECTIVE_ENTERED_OFF_PATTERN.name: 0.0,
        # no step broke its pattern: the monitor serves no break series
        **dict.fromkeys(BREAK_SERIES),
    }
    return RankSpec(rank=r, local_rank=r % gpus, world_size=world, nodes=nodes,
                    node=f"node-{r // gpus:03d}", step=SEQ // 10,
                    step_time_s=0.5 + 0.001 * (r % gpus), progress=tuple(progress.items()),
                    phase="forward" if waiting else "data")


def payloads(nodes: int, gpus: int, t0: float, hung: int | None) -> dict[str, bytes]:
    """``/train/<node>`` and ``/node/<node>`` → body: the job at t0, ``hung`` hanging."""
    world = nodes * gpus
    everyone = [_rank(r, gpus, world, nodes, t0, hung) for r in range(world)]
    out: dict[str, bytes] = {}
    for n in range(nodes):
        node = f"node-{n:03d}"
        out[f"/train/{node}"] = training_exposition(JOB, everyone[n * gpus:(n + 1) * gpus],
                                                    everyone)
        out[f"/node/{node}"] = exporter_exposition(node, [
            GpuSpec(gpu=i, pod=f"{JOB}-worker-{n}", pid=1000 + i, rank=n * gpus + i)
            for i in range(gpus)])
    return out


def _config(port: int, nodes: int, am: str) -> dict:
    def targets(kind: str) -> list[dict]:
        # one server answers for every pod, by path; each keeps the instance it would have
        # in a cluster (its pod's or node's address), as Kubernetes discovery sets it
        port_of = {"train": conv.TRAINING_PORT, "node": conv.EXPORTER_PORT}[kind]
        return [{"targets": [f"127.0.0.1:{port}"],
                 "labels": {"__metrics_path__": f"/{kind}/node-{n:03d}",
                            "instance": f"10.{1 if kind == 'train' else 2}.{n // 250}."
                                        f"{n % 250 + 1}:{port_of}",
                            "pod": f"{JOB}-worker-{n}", "node": f"node-{n:03d}"}}
                for n in range(nodes)]

    return {
        "global": {"evaluation_interval": GLOBAL_EVALUATION},
        "rule_files": [str(SHIPPED_RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [am.removeprefix("http://")]}]}]},
        "scrape_configs": [
            {"job_name": "fsdpmon-train", "scrape_interval": TRAINING_SCRAPE,
             "honor_labels": True, "static_configs": targets("train")},
            {"job_name": "fsdpmon-exporter", "scrape_interval": f"{EXPORTER_SCRAPE_S}s",
             "scrape_timeout": f"{EXPORTER_SCRAPE_S - 1}s", "honor_labels": True,
             "static_configs": targets("node")},
        ],
    }


@contextlib.contextmanager
def stack(tmp: Path, server: PayloadServer, nodes: int) -> Iterator[tuple]:
    with contextlib.ExitStack() as st:
        hook = st.enter_context(Webhook())
        route = alertmanager_config()
        route["receivers"][0]["webhook_configs"][0]["url"] = hook.url
        am = st.enter_context(alertmanager(tmp, hook.url, route))
        prom = st.enter_context(run_prometheus(tmp, _config(server.port, nodes, am),
                                               await_targets=True, timeout=120))
        yield prom, hook


def _group_durations(prom_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{prom_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            group = labels.split('rule_group="', 1)[1].split('"', 1)[0].rsplit(";", 1)[-1]
            out[group] = float(value)
    return out


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def watch_page(prom, hook: Webhook, t0: float, hung: int, deadline_s: float) -> list[str]:
    lines, longest, paged = [], {}, None
    end = time.time() + deadline_s
    while time.time() < end:
        for group, seconds in _group_durations(prom.url).items():
            longest[group] = max(longest.get(group, 0.0), seconds)
        firing = [n for n in hook.received() if n["status"] == "firing"]
        if firing and paged is None:
            paged = time.time() - t0
            end = min(end, time.time() + 60)  # what else arrives in the next minute
        time.sleep(5)
    alerts = [a["labels"] for n in hook.received() for a in n["alerts"]
              if a["status"] == "firing"]
    named = sorted({(a.get("alertname"), a.get("rank", "-"), a.get("pod", "-"),
                     a.get("node", "-")) for a in alerts})
    if len(named) > 5:  # a flood: say what it is, not every rank of it
        names = sorted({a.get("alertname") for a in alerts})
        named = [f"{len(named)} alerts of {names}"]
    firing = [n for n in hook.received() if n["status"] == "firing"]
    lines.append(f"hung rank {hung}: page {'NONE' if paged is None else f'{paged:.1f} s'} "
                 f"after its last step; {len(firing)} firing notification(s), naming {named}")
    worst = max(longest.values(), default=float("nan"))
    lines.append("rule groups' longest evaluation (s): "
                 + ", ".join(f"{g} {s:.3f}" for g, s in sorted(longest.items()))
                 + f"; worst {worst:.3f} (goal < {GOALS['evaluation_s']})")
    return lines


def series_per_rank(prom, world: int) -> str:
    train = prom.query('count({job="fsdpmon-train", rank!=""})')
    gpu = prom.query('count({job="fsdpmon-exporter", rank!=""})')
    each = prom.query('max(count by (rank) ({job="fsdpmon-train", rank!=""}))')
    n_train, n_gpu = (float(r[0]["value"][1]) if r else 0.0 for r in (train, gpu))
    most = float(each[0]["value"][1]) if each else 0.0
    return (f"series with a rank label: training {n_train:.0f} ({n_train / world:.1f} a rank, "
            f"the most {most:.0f}), exporter {n_gpu:.0f} ({n_gpu / world:.1f} a rank); goal "
            f"under {GOALS['series_per_rank']} a rank")


def _top_interval() -> float:
    """`fsdpmon top`'s default --interval, as its parser declares it."""
    parser = argparse.ArgumentParser()
    top_cli.configure(parser)
    return parser.get_default("interval")


class WholeReads(PrometheusSource):
    """The source as it was before it kept what it had read: every refresh reads the newest
    samples of every target again (the baseline)."""

    def fetch(self):
        self._held = ReadCache()
        return super().fetch()


def _window(proc: psutil.Process, source: PrometheusSource | None, seconds: float,
            interval: float) -> tuple[float, list[float], list[int]]:
    """``seconds`` of `top`'s loop (a refresh every ``interval``; none with no source): the
    Prometheus process's CPU time in it, each refresh's wall time and series read."""
    cpu0, end = _cpu(proc), time.monotonic() + seconds
    took, read = [], []
    while (tick := time.monotonic()) + interval <= end and source is not None:
        source.fetch()
        took.append(time.monotonic() - tick)
        read.append(source.series_read)
        time.sleep(max(0.0, tick + interval - time.monotonic()))
    time.sleep(max(0.0, end - time.monotonic()))
    return _cpu(proc) - cpu0, took, read


def refreshes(prom, windows: int, seconds: float) -> list[str]:
    """`top`'s loop at its default interval for ``seconds``, then as long a rest, ``windows``
    times, with this source and with the baseline (WholeReads) in turn: the Prometheus CPU
    in a window less that in the rest after it, over the window's refreshes, is what a
    refresh costs Prometheus, the work it leaves behind (its collector's) included; scrapes,
    rule evaluations and the collector's own cycles fall into both alike. Given as the mean and
    its standard error over the windows."""
    proc, interval = psutil.Process(prom.pid), _top_interval()
    sources = {"this source": PrometheusSource(prom.url, job_name=JOB, timeout_s=30),
               "reading everything (before)": WholeReads(prom.url, job_name=JOB, timeout_s=30)}
    cost: dict[str, list[float]] = {name: [] for name in sources}
    took: dict[str, list[float]] = {name: [] for name in sources}
    read: dict[str, list[int]] = {name: [] for name in sources}
    try:
        ranks = [len(source.fetch().ranks) for source in sources.values()]  # first reads
        for _ in range(windows):
            for name, source in sources.items():
                busy, times, series = _window(proc, source, seconds, interval)
                rest, _, _ = _window(proc, None, seconds, interval)
                cost[name].append((busy - rest) / len(times))
                took[name] += times
                read[name] += series
    finally:
        for source in sources.values():
            source.close()
    lines = [f"top --prometheus at {ranks[0]} ranks, a refresh "
             f"every {interval:g} s, {windows} windows of {seconds:g} s each and as long a rest "
             f"(goals: p50 <= {GOALS['refresh_p50_s'] * 1e3:.0f} ms, Prometheus CPU <= "
             f"{GOALS['prometheus_cpu_per_refresh_s']} s a refresh):"]
    for name in sources:
        mean = statistics.fmean(cost[name])
        error = statistics.stdev(cost[name]) / len(cost[name]) ** 0.5 if windows > 1 else 0.0
        lines.append(f"  {name}: p50 {statistics.median(took[name]) * 1e3:.0f} ms, max "
                     f"{max(took[name]) * 1e3:.0f} ms; {statistics.fmean(read[name]):,.0f} "
                     f"series read a refresh; Prometheus CPU {mean:.2f} ± {error:.2f} s a refresh "
                     f"(windows: {', '.join(f'{c:.2f}' for c in cost[name])})")
    ratio = statistics.fmean(cost["this source"]) / statistics.fmean(
        cost["reading everything (before)"])
    lines.append(f"  ratio of Prometheus CPU a refresh, this source to the baseline: {ratio:.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--hung", type=int, default=1337)
    parser.add_argument("--deadline", type=float, default=240.0)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=30.0)
    args = parser.parse_args()
    world = args.nodes * args.gpus
    print(f"{platform.node()}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
          f"{args.nodes} x {args.gpus} = {world} ranks, rules as shipped ({SHIPPED_RULES.name})",
          flush=True)
    began = time.perf_counter()
    server = PayloadServer(payloads(args.nodes, args.gpus, time.time(), None))
    print(f"  healthy payloads rendered in {time.perf_counter() - began:.1f} s, "
          f"{sum(map(len, server.payloads.values())) / 1e6:.0f} MB", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.closing(server), \
            stack(Path(tmp_name), server, args.nodes) as (prom, hook):
        t0 = time.time()  # the hang: every rank's last step
        server.payloads = payloads(args.nodes, args.gpus, t0, args.hung)
        print(f"  the hang served {time.time() - t0:.1f} s after it began", flush=True)
        for line in watch_page(prom, hook, t0, args.hung, args.deadline):
            print("  " + line, flush=True)
        print("  " + series_per_rank(prom, world), flush=True)
        for line in refreshes(prom, args.windows, args.window_s):
            print("  " + line, flush=True)
    print(f"load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
