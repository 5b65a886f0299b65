"""A small FSDP2 training job instrumented with the Monitor, for the monitor's end-to-end tests.

Run under ``torchrun --nproc_per_node 2``. It is "anyone's loop" using the public API, with
hooks the tests need: an injected sleep in one rank's data phase (a straggler), control files
to hold ranks after training, and its own wall-clock measurements to check the monitor against.

Control protocol (all in --control-dir): each rank writes ``pid.rank<R>`` at start, trains
--steps steps (or up to the step number written in ``stop``), writes ``done.rank<R>`` (its own
counts and timings), then waits for ``release.rank<R>``; rank 1 then exits abruptly (no close:
a crash, as far as the endpoint can tell), rank 0 closes the monitor and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.trainer.model import FLAVOURS, Transformer


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-seconds", type=float, default=0.0)
    p.add_argument("--control-dir", required=True)
    p.add_argument("--hold-seconds", type=float, default=60.0)
    return p.parse_args()


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_step(control: Path) -> int | None:
    """The step the test asked every rank to stop after (the same on all ranks)."""
    try:
        return int((control / "stop").read_text())
    except (OSError, ValueError):
        return None


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    control = Path(args.control_dir)
    (control / f"pid.rank{rank}").write_text(str(os.getpid()))
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Transformer(FLAVOURS["tiny"])
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens_per_step = args.batch * args.seq_len
    # Port, job name, log interval, JSONL path, stall settings: FSDPMON_* from the test.
    mon = Monitor(MonitorConfig.from_env(), model=model, seq_len=args.seq_len,
                  tokens_per_step=tokens_per_step, total_steps=args.steps,
                  run_info={"model": "tiny", "config": vars(args)})
    interval = mon.config.log_interval
    gen = torch.Generator().manual_seed(1000 + rank)
    # marks: (step, before, after) around each moment the monitor reads its clock for a
    # window's end (the log inside a log step's close) or its start (the first step's open):
    # the monitor's reading lies between the two, whatever the load.
    marks, tokens, loss = [], 0, torch.tensor(0.0)
    for step in range(1, args.steps + 1):
        before = time.perf_counter()
        with mon.step():
            if step == 1:
                marks.append((0, before, time.perf_counter()))
            with mon.phase("data"):
                batch = torch.randint(0, 512, (args.batch, args.seq_len + 1), generator=gen)
                if rank == args.slow_rank:
                    time.sleep(args.slow_seconds)
            with mon.phase("forward"):
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            with mon.phase("backward"):
                loss.backward()
            with mon.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            mon.record(loss=loss.detach(), lr=1e-3)
            before = time.perf_counter()
        tokens += batch[:, :-1].numel()
        if step % interval == 0:
            marks.append((step, before, time.perf_counter()))
        if stop_step(control) == step:
            break
    done = {"steps": step, "tokens": tokens, "final_loss": float(loss.detach()), "marks": marks}
    (control / f"done.rank{rank}").write_text(json.dumps(done))
    wait_for(control / f"release.rank{rank}", args.hold_seconds)
    if rank != 0:
        os._exit(0)  # abruptly: its state files stay behind, as after a crash
    mon.close()
    # Skip interpreter teardown: gloo's threads left behind by the gone rank 1 can abort it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
