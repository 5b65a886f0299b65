"""What the monitor costs a training loop. Prints measurements; asserts nothing.

1. The tiny Llama's training step with and without the monitor, interleaved step by step in one
   run (so machine load hits both alike): median step time of each and their ratio.
2. The monitor's host-side cost per non-log step: an empty loop with ``step()``, four phases
   and ``record()``, against the same loop with no-op context managers, in microseconds.
3. The cost of a log step (timers, loss read, memory, JSONL, state file), in milliseconds.
4. What straggler attribution adds per step (it is active only in a distributed job): the
   collective wrapper's cost per call x the collectives a real 2-rank tiny step makes (counted
   by the monitor in a torchrun run) + the per-step bookkeeping, as a share of the tiny step
   from 1., printed beside the monitor's own per-step host cost from 2., and beside the two
   wrappers it replaced (benchmarks/premerge_collectives.py), measured in the same run.
5. One row per integration (plain FSDP1/FSDP2 loops, Lightning, HF, Accelerate, DDP's timed
   hook): the host cost its adapter adds per non-log step, as a share of the tiny step from 1.
   (benchmarks/adapter_costs.py).
6. Where the endpoint is served, side by side while a scraper process asks it for /metrics
   --scrape-rate times a second: the tiny step with no monitor, with the monitor served by the
   pod's server process (fsdpmon.monitor.podserver, now), and with the monitor served by a
   thread of the training process (server.PortKeeper inside the rank, as before), in rotating
   blocks of steps (the scraper asks only the endpoint of the block being timed): the median
   step of each and the two ratios to no monitor.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_monitor.py [--steps N]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from fsdpmon import catalog
from fsdpmon.monitor import Monitor, MonitorConfig, collectives, podserver
from fsdpmon.monitor.server import PortKeeper
from fsdpmon.monitor.stacks import stacks_app
from fsdpmon.trainer.model import FLAVOURS, Transformer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the pre-merge reference
import adapter_costs
import premerge_collectives as premerge

PHASES = ("data", "forward", "backward", "optimizer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_monitor(workdir: Path, log_interval: int, job: str = "", **kw: object) -> Monitor:
    # The state files go where they go by default (/dev/shm when present); the JSONL goes to
    # the (disk) temp dir, as a user's run log would.
    cfg = MonitorConfig(port=free_port(), listen_address="127.0.0.1",
                        job_name=f"bench-{os.getpid()}{job}", log_interval=log_interval,
                        jsonl_path=str(workdir / f"bench-{log_interval}{job}.jsonl"))
    return Monitor(cfg, **kw)  # type: ignore[arg-type]


class NullSpans:
    """The same call shape as the monitor, doing nothing: the baseline loop."""

    def step(self) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def phase(self, name: str) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def record(self, **kw: object) -> None:
        pass


def tiny_step(m: Monitor | NullSpans, model: torch.nn.Module, opt: torch.optim.Optimizer,
              data: torch.Tensor) -> None:
    """One training step of the tiny Llama, its phases and loss told to ``m``."""
    with m.step():
        with m.phase("data"):
            x, y = data[:, :-1], data[:, 1:]
        with m.phase("forward"):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        with m.phase("backward"):
            loss.backward()
        with m.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        m.record(loss=loss.detach(), lr=1e-4)


def training_comparison(workdir: Path, steps: int, batch: int, seq: int) -> None:
    torch.manual_seed(0)
    model = Transformer(FLAVOURS["tiny"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    mon = make_monitor(workdir, 10, model=model, seq_len=seq, tokens_per_step=batch * seq)
    null = NullSpans()
    data = torch.randint(0, FLAVOURS["tiny"].vocab_size, (batch, seq + 1))

    def one_step(m: Monitor | NullSpans) -> float:
        start = time.perf_counter()
        tiny_step(m, model, opt, data)
        return time.perf_counter() - start

    for _ in range(10):  # warm-up, both paths
        one_step(null)
        one_step(mon)
    without, with_, log_steps = [], [], []
    for i in range(steps):  # interleaved (ABBA): load drift and order effects hit both alike
        if i % 2 == 0:
            without.append(one_step(null))
            with_.append(one_step(mon))
        else:
            with_.append(one_step(mon))
            without.append(one_step(null))
        if mon.step_number % mon.config.log_interval == 0:
            log_steps.append(len(with_) - 1)
    mon.close()
    med_without, med_with = statistics.median(without), statistics.median(with_)
    print(f"tiny Llama training step (batch {batch} x seq {seq}, {steps} steps each, "
          "interleaved ABBA, monitor logging every 10 steps):")
    print(f"  median step without monitor: {med_without * 1e3:8.2f} ms")
    print(f"  median step with monitor:    {med_with * 1e3:8.2f} ms")
    print(f"  median ratio with/without:   {med_with / med_without:8.4f}")
    print(f"  mean ratio with/without:     "
          f"{statistics.fmean(with_) / statistics.fmean(without):8.4f}")
    paired = statistics.median(w / wo for w, wo in zip(with_, without, strict=True))
    print(f"  median of paired ratios:     {paired:8.4f}   (each step vs its neighbour)")
    FIGURES["step_s"] = med_without
    plain = [t for i, t in enumerate(with_) if i not in set(log_steps)]
    print(f"  non-log steps with monitor:  {statistics.median(plain) / med_without:8.4f}   "
          f"log steps: {statistics.median([with_[i] for i in log_steps]) / med_without:.4f} "
          "(ratios to the median step without)")


def host_cost(workdir: Path, steps: int, repeats: int) -> None:
    loss = torch.tensor(1.0)

    def loop(m: Monitor | NullSpans) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            with m.step():
                for name in PHASES:
                    with m.phase(name):
                        pass
                m.record(loss=loss, lr=1e-4)
        return (time.perf_counter() - start) / steps

    # A log interval beyond the loop (the largest the config accepts): every step measured here
    # is a non-log step.
    interval = 1_000_000
    assert steps * repeats < interval, f"{steps} x {repeats} steps would reach a log step"
    mon = make_monitor(workdir, interval, flops_per_token=1e6, tokens_per_step=1024)
    null = NullSpans()
    costs = []
    for _ in range(repeats):
        base = loop(null)
        costs.append(loop(mon) - base)
    mon.close()
    FIGURES["host_us"] = statistics.median(costs) * 1e6
    print(f"host cost of the monitor per non-log step (step + 4 phases + record, "
          f"{steps} steps x {repeats} runs):")
    print(f"  median: {statistics.median(costs) * 1e6:6.2f} us   "
          f"min: {min(costs) * 1e6:6.2f} us   max: {max(costs) * 1e6:6.2f} us")


def log_step_cost(workdir: Path, steps: int) -> None:
    loss = torch.tensor(1.0)
    mon = make_monitor(workdir, 1, flops_per_token=1e6, tokens_per_step=1024)
    timings = []
    for _ in range(steps):
        start = time.perf_counter()
        with mon.step():
            mon.record(loss=loss, lr=1e-4)
        timings.append(time.perf_counter() - start)
    mon.close()
    print(f"cost of a log step (timers, loss, memory, gather, JSONL, state file; {steps} runs):")
    print(f"  median: {statistics.median(timings) * 1e3:6.3f} ms")


FIGURES: dict[str, float] = {}


def collectives_per_step(workdir: Path) -> float:
    """Collectives per step of the tiny model on 2 ranks, as the monitor counts them."""
    log = workdir / "attrib.jsonl"
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", "-m", "fsdpmon.trainer.train", "--model", "tiny",
                    "--max-steps", "10", "--log-every", "10", "--metrics-port", "0",
                    "--log-jsonl", str(log)], check=True, capture_output=True,
                   cwd=Path(__file__).resolve().parents[1],
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    steps = [json.loads(x) for x in (workdir / "attrib.rank0.jsonl").read_text().splitlines()]
    return float(next(r["collective_calls"] for r in steps if r["kind"] == "step"))


def attribution_cost(workdir: Path, calls: int, repeats: int) -> None:
    def raw(*args: object, **kwargs: object) -> None:
        return None

    # The merged wrapper with the timer as the monitor makes it (run-queue delay read around
    # each call), the same without that read, and the two wrappers it replaced (no such read).
    timers = {"merged": collectives.CollectiveTimer(),
              "merged, no rq": collectives.CollectiveTimer(run_queue=False),
              "before": collectives.CollectiveTimer(run_queue=False)}
    merged = collectives.wrap("all_reduce", raw)
    collectives.install()  # the wrapper reads each call's tensor: its size, its dtype's code
    tensor = torch.zeros(1024)  # a call's tensor, as FSDP's are (the fingerprint reads it)
    variants = {"merged": merged, "merged, no rq": merged,
                "before": premerge.stacked("all_reduce", raw)}
    premerge.activate(timers["before"])
    per_call: dict[str, list[float]] = {name: [] for name in variants}
    per_step = []
    for _ in range(repeats):
        for name, fn in variants.items():
            timer = timers[name]
            collectives._calls.timer = timer  # activate() would also patch torch.distributed
            timer.arm()
            start = time.perf_counter()
            for _ in range(calls):
                raw(tensor, group=None)
            mid = time.perf_counter()
            for _ in range(calls):
                fn(tensor, group=None)
            end = time.perf_counter()
            timer.step_done()
            timer.drain()
            per_call[name].append(((end - mid) - (mid - start)) / calls)
        timer = timers["merged"]
        start = time.perf_counter()
        for _ in range(calls):
            timer.arm()
            timer.step_done()
        per_step.append((time.perf_counter() - start) / calls)
        timer.drain()
    collectives._calls.timer = None
    premerge.activate(None)
    n = collectives_per_step(workdir)
    call = {name: statistics.median(v) for name, v in per_call.items()}
    step_s = statistics.median(per_step)
    added = call["merged"] * n + step_s
    tiny = FIGURES.get("step_s", float("nan"))
    print("straggler attribution + collective numbering, added per step of a 2-rank job:")
    print(f"  wrapper: {call['merged'] * 1e6:.2f} us per collective x {n:.0f} collectives per "
          f"tiny 2-rank step + {step_s * 1e6:.2f} us per step = {added * 1e6:.1f} us")
    print(f"  (the same wrapper without the run-queue reads: {call['merged, no rq'] * 1e6:.2f}"
          f" us per collective; the two wrappers before the merge: {call['before'] * 1e6:.2f} us "
          f"= {call['before'] * n * 1e6:.1f} us per step)")
    print(f"  = {added / tiny:.4%} of the tiny step ({tiny * 1e3:.1f} ms without monitor; "
          f"budget 0.5%); the monitor's own host cost per non-log step: "
          f"{FIGURES.get('host_us', float('nan')):.1f} us "
          f"= {FIGURES.get('host_us', float('nan')) * 1e-6 / tiny:.4%}")


SCRAPER = """
import sys, time, urllib.request
target, rate = sys.argv[1], float(sys.argv[2])
while True:
    port = open(target).read().strip()
    if port and port != "0":
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except OSError:
            pass
    time.sleep(1.0 / rate)
"""


def _wait_served(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            if catalog.TRAIN_STEP.name.encode() in r.read():
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing served on port {port}")


def _served_in_process(mon: Monitor) -> PortKeeper:
    """The endpoint as it was before the pod's server process: a PortKeeper thread in the rank
    serving the same state directory (the monitor's own server is ended first)."""
    assert mon.pub is not None and mon.pub.keeper is not None and mon.pub.writer is not None
    mon.pub.keeper.close()  # the only rank: this ends the server process it started
    cfg = mon.config
    directory = mon.pub.writer.directory
    keeper = PortKeeper(directory, cfg.listen_address, cfg.port, 0.0, cfg.server_retry_seconds,
                        max_per_second=cfg.max_scrapes_per_second,
                        routes={"/stacks": stacks_app(directory, cfg.job_name)})
    keeper.start()
    return keeper


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serving_comparison(workdir: Path, steps: int, batch: int, seq: int, rate: float,
                       block: int = 40) -> None:
    """Blocks of ``block`` steps per variant, rotating ABC CBA; per block its wall time and
    this process's CPU time (all its threads: an endpoint thread's renders count) per step."""
    torch.manual_seed(0)
    model = Transformer(FLAVOURS["tiny"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, FLAVOURS["tiny"].vocab_size, (batch, seq + 1))
    now = make_monitor(workdir, 10, model=model, seq_len=seq, tokens_per_step=batch * seq,
                       job="now")
    before = make_monitor(workdir, 10, model=model, seq_len=seq, tokens_per_step=batch * seq,
                          job="before")
    keeper = _served_in_process(before)
    _wait_served(now.config.port)
    _wait_served(before.config.port)
    assert now.pub is not None and now.pub.writer is not None
    server = podserver.server_pid(now.pub.writer.directory)
    assert server is not None, "the monitor started no server process"
    target = workdir / "scrape-port"
    target.write_text("0")
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, str(target), str(rate)])
    variants: dict[str, tuple[Monitor | NullSpans, int]] = {
        "no monitor": (NullSpans(), 0), "server process (now)": (now, now.config.port),
        "thread in the rank (before)": (before, before.config.port)}
    rounds: list[dict[str, tuple[float, float]]] = []  # per round: (wall, cpu) per step
    server_cpu, now_wall = 0.0, 0.0

    def one_step(m: Monitor | NullSpans) -> None:
        tiny_step(m, model, opt, data)

    try:
        names = list(variants)
        for i in range(steps // block):
            name = names[i % len(names)] if (i // len(names)) % 2 == 0 else \
                names[-1 - i % len(names)]  # ABC CBA: drift hits every variant alike
            mon, port = variants[name]
            target.write_text(str(port))
            time.sleep(1.5 / rate)  # the scraper turns to this block's endpoint
            served = _cpu_seconds(server)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(block):
                one_step(mon)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if name.endswith("(now)"):
                server_cpu += _cpu_seconds(server) - served
                now_wall += wall
            if i % len(names) == 0:
                rounds.append({})
            rounds[-1][name] = (wall / block, cpu / block)
    finally:
        scraper.kill()
        scraper.wait()
        keeper.close()
        now.close()
        before.close()
    full = [r for r in rounds if len(r) == len(variants)]
    print(f"the endpoint's place, scraped {rate:g}/s by another process ({len(full)} rounds of "
          f"one {block}-step block per variant, ABC CBA): per step, medians over the rounds")
    for name in names:
        wall = statistics.median(r[name][0] for r in full)
        cpu = statistics.median(r[name][1] for r in full)
        wall_ratio = statistics.median(r[name][0] / r["no monitor"][0] for r in full)
        cpu_ratio = statistics.median(r[name][1] / r["no monitor"][1] for r in full)
        print(f"  {name:<28} wall {wall * 1e3:7.2f} ms (x{wall_ratio:.4f})   this process's "
              f"CPU {cpu * 1e3:7.2f} ms (x{cpu_ratio:.4f})")
    print(f"  the server process itself: {server_cpu * 1e3:.0f} ms CPU over {now_wall:.1f} s of "
          f"its blocks = {server_cpu / now_wall:.2%} of one core (rendering for the scrapes)")


def timed(label: str, fn: Callable[[], None]) -> None:
    start = time.perf_counter()
    fn()
    print(f"  ({label} took {time.perf_counter() - start:.1f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="training steps per variant")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--host-steps", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--serving-steps", type=int, default=1200,
                   help="steps of the endpoint comparison, all variants together")
    p.add_argument("--scrape-rate", type=float, default=10.0,
                   help="scrapes per second in the endpoint comparison (10: the default cap)")
    p.add_argument("--part", choices=("all", "serving", "attribution"), default="all")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU only")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.part == "attribution":  # the collective wrapper alone (no tiny step: no share)
            timed("attribution cost", lambda: attribution_cost(workdir, args.host_steps,
                                                               args.repeats))
            return
        if args.part == "serving":
            timed("endpoint comparison", lambda: serving_comparison(
                workdir, args.serving_steps, args.batch, args.seq_len, args.scrape_rate))
            return
        timed("training comparison", lambda: training_comparison(
            workdir, args.steps, args.batch, args.seq_len))
        timed("host cost", lambda: host_cost(workdir, args.host_steps, args.repeats))
        timed("log step cost", lambda: log_step_cost(workdir, 200))
        timed("attribution cost", lambda: attribution_cost(workdir, args.host_steps,
                                                           args.repeats))
        timed("per integration", lambda: adapter_costs.rows(
            workdir, free_port, args.host_steps, args.repeats, FIGURES["step_s"]))
        timed("endpoint comparison", lambda: serving_comparison(
            workdir, args.serving_steps, args.batch, args.seq_len, args.scrape_rate))


if __name__ == "__main__":
    main()
