"""The training loop of ``fsdpmon.trainer.train`` (the entry point, which checks the flags first).

The loop takes one ``fsdpmon.monitor.Monitor``: it times the phases of each step, serves the
Prometheus endpoint, writes the per-rank JSONL log, and calls back once per log step, which is
where the console line comes from.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import torch
except ModuleNotFoundError:  # the base install (`pip install fsdpmon`) has no torch
    print("trainer: error: the trainer needs the 'train' extra: pip install 'fsdpmon[train]'",
          file=sys.stderr)
    raise SystemExit(2) from None
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from fsdpmon import faultspec
from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.trainer import faults
from fsdpmon.trainer.checkpoint import Checkpointer, TrainState
from fsdpmon.trainer.config import TrainConfig, model_args_for
from fsdpmon.trainer.data import BatchLoader, SampleSource, build_source
from fsdpmon.trainer.hf_weights import load_hf_weights, read_config
from fsdpmon.trainer.model import Transformer
from fsdpmon.trainer.parallel import (
    DistEnv,
    build_fsdp_model,
    choose_device,
    init_distributed,
)
from fsdpmon.trainer.resume import resume_newest

log = logging.getLogger("trainer")


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: Transformer, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    decay = [p for p in model.parameters() if p.ndim >= 2]  # no decay on norm weights
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.optim.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.optim.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    o = cfg.optim
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: lr_factor(s, o.warmup_steps, cfg.max_steps, o.min_lr_ratio)
    )
    return optim, sched


def clip_gradients(model: Transformer, max_norm: float) -> torch.Tensor:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, norm)
    return norm


def console_line(total_steps: int) -> Callable[[dict[str, Any]], None]:
    """The monitor's log listener behind the one console line per log step (rank 0)."""

    def emit(record: dict[str, Any]) -> None:
        mem = record.get("peak_memory_bytes") or 0
        loss = (record.get("job") or {}).get("loss_mean", record["loss"])  # mean over ranks
        print(f"step {record['step']}/{total_steps} | loss {loss:.4f} | "
              f"lr {record['lr']:.2e} | grad_norm {record['grad_norm']:.3f} | "
              f"tok/s {record['tokens_per_second']:,.0f} | step {record['step_time_s']:.3f}s | "
              f"mem {mem / 2**20:,.0f} MiB", flush=True)
    return emit


@dataclass
class Trainer:
    cfg: TrainConfig
    env: DistEnv
    device: torch.device
    model: Transformer
    optim: torch.optim.Optimizer
    sched: Any
    loader: BatchLoader
    checkpointer: Checkpointer | None
    faults: faults.FaultPlan = field(default_factory=faults.FaultPlan)
    step: int = 0
    restored: tuple[int, float] | None = None  # (step, seconds) of the checkpoint loaded

    @property
    def global_tokens(self) -> int:
        d = self.cfg.data
        return d.batch_size * d.seq_len * d.grad_accum * self.env.world_size

    def resume(self) -> None:
        if self.checkpointer is None:
            return
        self.checkpointer.remove_incomplete()
        began = time.monotonic()
        resumed = resume_newest(self.checkpointer, self.model, self.optim)
        if resumed is None:
            return
        state, path = resumed
        self.restored = (state.step, time.monotonic() - began)
        self.sched.load_state_dict(state.scheduler)
        self.loader.position, self.step = state.data_position, state.step
        if self.env.rank == 0:
            log.info("resumed from %s (step %d, restart %d)", path, state.step,
                     self.env.restart_count)

    def accumulate_gradients(self, mon: Monitor) -> torch.Tensor:
        """Forward and backward over this step's micro-batches; returns this rank's mean loss."""
        d = self.cfg.data
        loss_total = torch.zeros((), device=self.device)
        step = self.step + 1  # the step being made, as the console counts it
        clock = faults.compute_clock(self.device.type)
        for _ in range(d.grad_accum):
            with mon.phase("data"):
                inputs, targets = next(self.loader)
                inputs, targets = inputs.to(self.device), targets.to(self.device)
            with mon.phase("forward"):
                began = clock()
                logits = self.model(inputs)
                loss_sum = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                           reduction="sum")
                self.faults.slow_compute(step, clock() - began)
            with mon.phase("backward"):
                began = clock()
                # Normalised by the GLOBAL token count; FSDP sums gradients over ranks.
                (loss_sum / self.global_tokens).backward()
                self.faults.slow_compute(step, clock() - began)
            loss_total += loss_sum.detach()
        return self.faults.loss(step, loss_total / (d.batch_size * d.seq_len * d.grad_accum))

    def optimizer_step(self) -> tuple[torch.Tensor, float]:
        grad_norm = clip_gradients(self.model, self.cfg.optim.grad_clip)
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        lr = self.sched.get_last_lr()[0]
        self.sched.step()
        return grad_norm, lr

    def train_step(self, mon: Monitor) -> None:
        with mon.step():
            # The global sample index of this step's first micro-batch: with the rank, batch
            # size and world size it names the rank's batch (fsdpmon.trainer.data.batch_at replays
            # it).
            position = self.loader.position
            loss = self.accumulate_gradients(mon)
            with mon.phase("optimizer"):
                grad_norm, lr = self.optimizer_step()
            mon.record(loss=loss, lr=lr, grad_norm=grad_norm, batch={"position": position})
        self.step += 1

    def save(self, mon: Monitor) -> None:
        if self.checkpointer is None:
            return
        with mon.phase("checkpoint"):
            self.checkpointer.save(self.model, self.optim, TrainState(
                self.step, self.loader.position, self.sched.state_dict()))

    def run(self, mon: Monitor) -> None:
        every = self.cfg.checkpoint.every
        started, first = time.monotonic(), self.step
        while self.step < self.cfg.max_steps:
            self.train_step(mon)
            self.faults.after_step(self.step)
            if (every and self.step % every == 0) or self.step == self.cfg.max_steps:
                self.save(mon)
        if self.env.rank == 0:
            log.info("finished: %d steps in %.1f s", self.step - first,
                     time.monotonic() - started)


def _model_label(cfg: TrainConfig) -> str:
    """The flavour, or the HF checkpoint's directory name (e.g. Llama-2-7b-hf) when loading one."""
    hf_dir = cfg.model.hf_checkpoint
    return Path(hf_dir).resolve().name if hf_dir else cfg.model.name


def _monitor_config(cfg: TrainConfig) -> MonitorConfig:
    # Flags win; what they leave unset comes from FSDPMON_* (e.g. set by the job manifest).
    return MonitorConfig.from_env(port=cfg.log.metrics_port, job_name=cfg.log.job_name,
                                  log_interval=cfg.log.log_every, jsonl_path=cfg.log.log_jsonl)


def _monitor_for(trainer: Trainer, cfg: TrainConfig) -> Monitor:
    mon_cfg = _monitor_config(cfg)
    d = cfg.data
    mon = Monitor(mon_cfg, model=trainer.model, seq_len=d.seq_len,
                  tokens_per_step=d.batch_size * d.seq_len * d.grad_accum,
                  total_steps=cfg.max_steps, start_step=trainer.step,
                  run_info={"model": _model_label(cfg), "config": cfg.to_json()})
    if trainer.env.rank == 0:
        mon.add_log_listener(console_line(cfg.max_steps))
    if trainer.restored is not None:
        mon.checkpoint_restored(*trainer.restored)
    return mon


def build_trainer(cfg: TrainConfig, env: DistEnv, device: torch.device, mesh: DeviceMesh,
                  source: SampleSource, plan: faults.FaultPlan | None = None) -> Trainer:
    """Model (sharded, initialised or loaded), optimiser, schedule, data; resumed if possible."""
    hf_dir = cfg.model.hf_checkpoint
    args = model_args_for(cfg, read_config(hf_dir)[0] if hf_dir else None)
    torch.manual_seed(cfg.seed)
    model = build_fsdp_model(args, cfg.parallel, mesh, device, cfg.seed)
    if hf_dir:
        load_hf_weights(model, hf_dir)
    optim, sched = build_optimizer(model, cfg)
    plan = plan or faults.FaultPlan()
    loader = BatchLoader(source, cfg.data.batch_size, env.rank, env.world_size)
    ckpt = (Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.keep, env.rank, plan)
            if cfg.checkpoint.dir else None)
    trainer = Trainer(cfg, env, device, model, optim, sched, loader, ckpt, plan)
    trainer.loader = plan.wrap_loader(loader, lambda: trainer.step)
    trainer.resume()
    return trainer


def train(cfg: TrainConfig) -> int:
    env = DistEnv.from_env()
    _setup_logging(env.rank)
    plan = faults.FaultPlan.for_rank(faultspec.from_sources(cfg.fault), env.rank, env.world_size)
    if plan.faults:
        log.warning("fault injection on rank %d: %s", env.rank,
                    "; ".join(faultspec.describe(f) for f in plan.faults))
    device = choose_device(env)
    hf_dir = cfg.model.hf_checkpoint
    args = model_args_for(cfg, read_config(hf_dir)[0] if hf_dir else None)
    # Read (and tokenise) the data before any process group exists: bad input fails fast.
    source = build_source(cfg.data.source, cfg.data.tokenizer, args.vocab_size,
                          cfg.data.seq_len, cfg.seed)
    mesh = init_distributed(env, device)
    try:
        trainer = build_trainer(cfg, env, device, mesh, source, plan)
        mon = _monitor_for(trainer, cfg)
        try:
            trainer.run(mon)
        finally:
            mon.close()
        # Leave together: a rank tearing gloo down while a peer is still in its last
        # collective makes that peer abort ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _setup_logging(rank: int) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s")
