"""bench_monitor's rows per integration: the host cost each adapter adds per non-log step,
measured as bench_monitor.host_cost measures the bare Monitor (the adapter's per-step calls in a
loop, less the same loop without them), plus what DDP's timed communication hook adds to a
real DDP step (a world of one, gloo) over DDP's own C++ all-reduce.

Lightning's hooks are driven with a stand-in for its Trainer (the three attributes the callback
reads); HF's with its real TrainingArguments/TrainerState/TrainerControl; Accelerate's through a
real single-process ``Accelerator(cpu=True)``."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from fsdpmon.monitor import Monitor, MonitorConfig

INTERVAL = 1_000_000  # no log step inside the loops


def _config(workdir: Path, port: int) -> MonitorConfig:
    return MonitorConfig(port=port, listen_address="127.0.0.1", job_name="bench-adapters",
                         log_interval=INTERVAL, jsonl_path=str(workdir / "adapters.jsonl"))


def _per_step(body: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        body()
    return (time.perf_counter() - start) / steps


def _median_cost(with_: Callable[[], None], without: Callable[[], None], steps: int,
                 repeats: int) -> float:
    return statistics.median(_per_step(with_, steps) - _per_step(without, steps)
                             for _ in range(repeats))


def plain_loop(mon: Monitor) -> Callable[[], None]:
    loss = torch.tensor(1.0)

    def body() -> None:
        with mon.step():
            for name in ("data", "forward", "backward", "optimizer"):
                with mon.phase(name):
                    pass
            mon.record(loss=loss, lr=1e-4)
    return body


def lightning_hooks(config: MonitorConfig) -> tuple[Callable[[], None], Callable[[], None]]:
    from fsdpmon.monitor.lightning import FsdpmonCallback

    cb = FsdpmonCallback(config, tokens_per_batch=1024)
    opt = SimpleNamespace(param_groups=[{"lr": 1e-4}])
    trainer = SimpleNamespace(global_step=0, optimizers=[opt], max_steps=-1,
                              accumulate_grad_batches=1, strategy=None)
    cb.monitor = Monitor(config, tokens_per_step=1024)
    cb.on_train_epoch_start(trainer, None)
    out = {"loss": torch.tensor(1.0)}

    def body() -> None:
        cb.on_train_batch_start(trainer, None, None, 0)
        cb.on_before_optimizer_step(trainer, None, opt)
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, None, out, None, 0)
    return body, lambda: cb.monitor.close()


def hf_hooks(config: MonitorConfig) -> tuple[Callable[[], None], Callable[[], None]]:
    import transformers

    from fsdpmon.monitor.hf import FsdpmonCallback

    cb = FsdpmonCallback(config)
    args = transformers.TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[],
                                          use_cpu=True)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    cb.monitor = Monitor(config, tokens_per_step=1024)
    cb.monitor.auto_log = False

    def body() -> None:
        cb.on_step_begin(args, state, control)
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_optimizer_step(args, state, control)
        cb.on_step_end(args, state, control)
    return body, lambda: cb.monitor.close()


def accelerate_batches(config: MonitorConfig, steps: int
                       ) -> tuple[Callable[[], None], Callable[[], None]]:
    from accelerate import Accelerator

    from fsdpmon.monitor.accelerate import AccelerateMonitor

    mon = AccelerateMonitor(Accelerator(cpu=True), None, config, tokens_per_batch=1024)
    batches = mon.batches(iter(range(10 ** 9)))
    loss = torch.tensor(1.0)

    def body() -> None:
        next(batches)
        mon.record(loss=loss)
    return body, mon.close


def rows(workdir: Path, ports: Callable[[], int], steps: int, repeats: int,
         tiny_step_s: float) -> None:
    def nothing() -> None:
        return None

    figures: dict[str, float] = {}
    mon = Monitor(_config(workdir, ports()), tokens_per_step=1024)
    figures["FSDP1 / FSDP2 loop (Monitor)"] = _median_cost(plain_loop(mon), nothing, steps,
                                                            repeats)
    mon.close()
    for name, make in (("Lightning callback", lightning_hooks), ("HF TrainerCallback", hf_hooks),
                       ("Accelerate helper", lambda c: accelerate_batches(c, steps))):
        try:
            body, close = make(_config(workdir, ports()))
        except ImportError as exc:
            print(f"  {name}: not installed ({exc.name})")
            continue
        figures[name] = _median_cost(body, nothing, steps, repeats)
        close()
    figures["DDP timed hook (Accelerate/HF/Lightning DDP)"] = ddp_hook_cost(workdir, repeats)
    print(f"per integration, the monitor's host cost per non-log step ({steps} steps x "
          f"{repeats} runs, median) and its share of the tiny step "
          f"({tiny_step_s * 1e3:.1f} ms; budget 0.5%):")
    for name, cost in figures.items():
        print(f"  {name:46s} {cost * 1e6:8.2f} us  {cost / tiny_step_s:8.4%}")


def ddp_hook_cost(workdir: Path, repeats: int, steps: int = 300) -> float:
    """Per step of a real DDP (Linear 256x256, world of one): timed hook minus no hook."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from fsdpmon.monitor import collectives

    timer = collectives.CollectiveTimer()
    collectives.activate(timer)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/ddp-store", rank=0,
                            world_size=1)
    try:
        plain, hooked = DDP(torch.nn.Linear(256, 256)), DDP(torch.nn.Linear(256, 256))
        plain._fsdpmon_ddp_watched = True  # keeps DDP's built-in C++ all-reduce
        x = torch.randn(8, 256)

        def step(model: DDP) -> Callable[[], None]:
            def body() -> None:
                timer.arm()
                model(x).sum().backward()
                timer.step_done()
            return body

        for _ in range(20):
            step(plain)()
            step(hooked)()
        cost = _median_cost(step(hooked), step(plain), steps, repeats)
        timer.drain()
        return cost
    finally:
        dist.destroy_process_group()
        collectives.activate(None)
