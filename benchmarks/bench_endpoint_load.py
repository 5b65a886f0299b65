"""What scrapers cost training: step time with and without 16 flat-out scrapers, in one run.

A tiny Llama trains in this process with the Monitor serving its endpoint (as rank 0 of a pod
does). A second process runs ``--clients`` threads that scrape ``/metrics`` back to back, switched
on and off in alternating blocks (quiet, loaded, quiet, ...), so machine load drifts hit both
alike. Prints the median step time of each, their ratio, and what the scrapers got. Goal (issue
18): loaded / quiet <= 1.05 with the default pace. The endpoint threads' own CPU is printed too:
it is what the scrapers take from the process, whatever else runs on the machine.
``--max-scrapes-per-second 1000`` shows what an unpaced endpoint would cost; ``--clients 1 --gap 1``
is a scraper at 15x Prometheus's usual cadence. The ratio of quiet blocks to each other is printed
as the noise floor. Asserts nothing.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_endpoint_load.py [--seconds 40]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.trainer.model import FLAVOURS, Transformer

# The scrapers run in their own process (stdlib only, so it starts at once), switched by lines
# on stdin: "1" on, "0" off, "q" quit and print "answered failed".
SCRAPERS = r"""
import sys, threading, urllib.request
url, clients, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
on, stop, counts, lock = threading.Event(), threading.Event(), [0, 0], threading.Lock()
def loop():
    while not stop.is_set():
        if not on.wait(0.1):
            continue
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
            k = 0
        except OSError:
            k = 1
        with lock:
            counts[k] += 1
        if gap:
            stop.wait(gap)
for _ in range(clients):
    threading.Thread(target=loop, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "1":
        on.set()
    elif cmd == "0":
        on.clear()
    elif cmd == "c":
        print(counts[0], counts[1], flush=True)
    else:
        break
stop.set()
print(counts[0], counts[1], flush=True)
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--block", type=float, default=2.0, help="seconds per quiet/loaded block")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-scrapes-per-second", type=float, default=None)
    p.add_argument("--gap", type=float, default=0.0,
                   help="seconds each client waits between its scrapes (0: flat out; Prometheus "
                        "waits its scrape interval, 15-30 s)")
    args = p.parse_args()
    torch.manual_seed(0)
    model = Transformer(FLAVOURS["tiny"])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, seq = 4, 64
    port = _free_port()
    state = tempfile.mkdtemp(prefix="bench-endpoint.")
    extra = {} if args.max_scrapes_per_second is None else {
        "max_scrapes_per_second": args.max_scrapes_per_second}
    cfg = MonitorConfig(port=port, job_name="bench", state_dir=state,
                        listen_address="127.0.0.1", log_interval=10, **extra)
    mon = Monitor(cfg, model=model, seq_len=seq, tokens_per_step=batch * seq)
    url = f"http://127.0.0.1:{port}/metrics"
    _wait_up(url)
    proc = subprocess.Popen([sys.executable, "-c", SCRAPERS, url, str(args.clients), str(args.gap)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()

    def command(cmd: str) -> list[int]:
        proc.stdin.write(cmd + "\n")
        proc.stdin.flush()
        return [int(v) for v in proc.stdout.readline().split()] if cmd in "cq" else []
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}  # the training thread's own CPU
    # Quiet steps by the parity of their block: two samples of the same condition, whose ratio
    # is the noise floor of the quiet/loaded comparison on this machine at this moment.
    quiet_halves: tuple[list[float], list[float]] = ([], [])
    quiet_blocks = 0
    start = time.monotonic()
    loaded = False
    pace = cfg.max_scrapes_per_second
    settle_end, block_end = start, start + args.block
    loaded_wall, switched_on = 0.0, start
    try:
        while time.monotonic() - start < args.seconds:
            if time.monotonic() >= block_end:
                loaded = not loaded
                quiet_blocks += not loaded
                command("1" if loaded else "0")
                now = time.monotonic()
                if not loaded:
                    loaded_wall += now - switched_on
                switched_on = now
                # Steps while the queue fills or drains (clients / pace seconds) are not counted.
                settle_end = time.monotonic() + args.clients / pace + 0.2
                block_end = settle_end + args.block
            x = torch.randint(0, FLAVOURS["tiny"].vocab_size, (batch, seq + 1))
            t0, c0 = time.perf_counter(), time.thread_time()
            with mon.step():
                logits = model(x[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
                mon.record(loss=loss.detach(), lr=1e-3)
            if time.monotonic() >= settle_end:
                times[loaded].append(time.perf_counter() - t0)
                cpu[loaded].append(time.thread_time() - c0)
                if not loaded:
                    quiet_halves[quiet_blocks % 2].append(times[False][-1])
    finally:
        if loaded:
            loaded_wall += time.monotonic() - switched_on
        served_cpu = endpoint_cpu_seconds()
        answered, failed = command("q")
        proc.wait(10)
        mon.close()
    quiet, busy = statistics.median(times[False]), statistics.median(times[True])
    how = f"waiting {args.gap:g}s between scrapes" if args.gap else "scraping flat out"
    print(f"endpoint pace {pace:g} requests/s, {args.clients} clients {how}, "
          f"blocks of {args.block:g}s over {args.seconds:g}s")
    print(f"step time median: quiet {quiet * 1e3:.2f} ms ({len(times[False])} steps), "
          f"loaded {busy * 1e3:.2f} ms ({len(times[True])} steps), "
          f"loaded/quiet {busy / quiet:.3f} (goal <= 1.05)")
    a, b = (statistics.median(h) for h in quiet_halves)
    print(f"noise floor: quiet blocks of one parity against the other {max(a, b) / min(a, b):.3f}"
          f" ({len(quiet_halves[0])} and {len(quiet_halves[1])} steps): a loaded/quiet ratio "
          "within it is not a measurable cost")
    cq, cb = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"training thread CPU per step median: quiet {cq * 1e3:.2f} ms, loaded "
          f"{cb * 1e3:.2f} ms, loaded/quiet {cb / cq:.3f} (insensitive to other processes' load;"
          f" wall time is not, on a busy machine compare several runs)")
    print(f"scrapes answered {answered} in {loaded_wall:.0f}s of load "
          f"({answered / max(loaded_wall, 1e-9):.1f}/s), failed {failed}; the endpoint's "
          f"threads used {served_cpu:.2f} s of CPU ({served_cpu / max(loaded_wall, 1e-9):.1%} "
          f"of a core while loaded, {served_cpu / max(answered, 1) * 1e3:.2f} ms a request)")


def endpoint_cpu_seconds() -> float:
    """CPU time of the endpoint's threads (accept loop and workers) in this process."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("fsdpmon-http") and thread.native_id is not None:
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"endpoint {url} never came up")


if __name__ == "__main__":
    main()
