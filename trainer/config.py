"""The trainer's configuration: a typed dataclass tree, its command line, and its validation.

Every bad value fails at start with ``ConfigError``/``InputError`` naming the flag, before any
process group is created, so the user sees one line instead of a distributed traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from fsdpmon import faultspec, validate
from fsdpmon.conventions import TRAINING_PORT
from fsdpmon.errors import ConfigError, InputError
from fsdpmon.helpformat import HelpFormatter
from fsdpmon.trainer.shapes import FLAVOURS, ModelArgs

# Flags that override single ModelArgs fields (for --model custom, or to shrink a flavour).
SHAPE_FLAGS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim")


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    hf_checkpoint: str | None = None
    overrides: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    source: str = "synthetic"  # "synthetic" or a text/JSONL file or a directory of them
    tokenizer: str | None = None
    seq_len: int = 128
    batch_size: int = 4  # sequences per rank per micro-batch
    grad_accum: int = 1


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass(frozen=True)
class ParallelConfig:
    dtype: str = "auto"  # auto: bf16 params / fp32 reduce on CUDA, fp32 on CPU
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    compile: bool = False


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str | None = None
    every: int = 0  # 0: only at the end (when a dir is given)
    keep: int = 2


@dataclass(frozen=True)
class LogConfig:
    log_every: int | None = None  # None: FSDPMON_LOG_INTERVAL, else the monitor's default (10)
    log_jsonl: str | None = None
    metrics_port: int | None = None  # None: FSDPMON_PORT or the default; 0: do not serve
    job_name: str | None = None


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 30
    seed: int = 0
    fault: str | None = None  # fsdpmon.faultspec grammar; FSDPMON_FAULT applies as well
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError("command line", message)


def build_parser() -> argparse.ArgumentParser:
    p = _RaisingParser(prog="python -m fsdpmon.trainer.train", formatter_class=HelpFormatter,
                       description="FSDP2 training of Llama-family models, monitored by fsdpmon.")
    a = p.add_argument
    a("--model", default="tiny", help=f"model flavour: {', '.join(FLAVOURS)}")
    a("--max-steps", type=int, default=30, help="optimiser steps to train for")
    a("--batch-size", type=int, default=4, help="sequences per rank per micro-batch")
    a("--seq-len", type=int, default=128, help="tokens per sequence")
    a("--grad-accum", type=int, default=1, help="micro-batches per optimiser step")
    a("--lr", type=float, default=3e-4, help="peak learning rate")
    a("--warmup-steps", type=int, default=0, help="linear warm-up steps before the cosine decay")
    a("--min-lr-ratio", type=float, default=0.1, help="cosine floor as a share of --lr")
    a("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    a("--grad-clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    a("--data", default="synthetic", help="'synthetic', or a .txt/.jsonl file or a directory")
    a("--tokenizer", default=None, help="local dir with tokenizer.json (default: bytes)")
    a("--hf-checkpoint", default=None,
      help="local dir of a HF Llama checkpoint (safetensors) to start from (default: random init)")
    a("--checkpoint-dir", default=None,
      help="where to save (and resume from) checkpoints; checked writable at start "
      "(default: no checkpoints)")
    a("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: at end)")
    a("--keep-checkpoints", type=int, default=2, help="newest checkpoints kept on disk")
    a("--seed", type=int, default=0, help="seed of the initial weights and the synthetic data")
    a("--fault", default=None, metavar="SPEC",
      help="inject a fault, e.g. compute-slow:rank=1,factor=1.5 (see fsdpmon.faultspec; "
           "FSDPMON_FAULT applies too; default: none)")
    a("--log-every", type=int, default=None,
      help="steps per log window (console line, JSONL record, metrics update; default: "
      "$FSDPMON_LOG_INTERVAL or 10)")
    a("--log-jsonl", default=None,
      help="PATH: each rank writes PATH with .rankN inserted; checked writable at start "
      "(default: no log file)")
    a("--metrics-port", type=int, default=None,
      help=f"Prometheus port (0: do not serve; default: $FSDPMON_PORT or {TRAINING_PORT})")
    a("--job-name", default=None,
      help="job_name label of the metrics (default: $FSDPMON_JOB_NAME or fsdpmon)")
    a("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
      help="auto: bf16 parameters with fp32 reduction on CUDA, fp32 on CPU")
    a("--activation-checkpointing", action="store_true",
      help="recompute each block's activations in the backward pass (less memory)")
    a("--cpu-offload", action="store_true", help="keep sharded parameters in host memory")
    a("--compile", action="store_true", help="torch.compile each transformer block")
    for name in SHAPE_FLAGS:
        a(f"--{name.replace('_', '-')}", type=int, default=None,
          help=f"override the flavour's {name} (default: the flavour's)")
    return p


def parse_config(argv: list[str] | None = None, *, check_paths: bool = True) -> TrainConfig:
    """The checked configuration. ``check_paths=False`` skips what only the machine that trains
    can check (files exist, directories writable): `fsdpmon manifests` validates train args for
    pods whose file systems it cannot see."""
    ns = build_parser().parse_args(argv)
    overrides = {n: getattr(ns, n) for n in SHAPE_FLAGS if getattr(ns, n) is not None}
    cfg = TrainConfig(
        max_steps=ns.max_steps,
        seed=ns.seed,
        fault=ns.fault,
        model=ModelConfig(ns.model, ns.hf_checkpoint, overrides),
        data=DataConfig(ns.data, ns.tokenizer, ns.seq_len, ns.batch_size, ns.grad_accum),
        optim=OptimConfig(ns.lr, ns.warmup_steps, ns.min_lr_ratio, ns.weight_decay, ns.grad_clip),
        parallel=ParallelConfig(ns.dtype, ns.activation_checkpointing, ns.cpu_offload,
                                ns.compile),
        checkpoint=CheckpointConfig(ns.checkpoint_dir, ns.checkpoint_every, ns.keep_checkpoints),
        log=LogConfig(ns.log_every, ns.log_jsonl, ns.metrics_port, ns.job_name),
    )
    validate_config(cfg, check_paths=check_paths)
    return cfg


def validate_config(cfg: TrainConfig, *, check_paths: bool = True) -> None:
    validate.one_of("--model", cfg.model.name, FLAVOURS)
    faultspec.from_sources(cfg.fault)  # a bad spec fails here, naming it
    validate.positive("--max-steps", cfg.max_steps)
    validate.positive("--seq-len", cfg.data.seq_len)
    validate.positive("--batch-size", cfg.data.batch_size)
    validate.positive("--grad-accum", cfg.data.grad_accum)
    validate.positive("--lr", cfg.optim.lr)
    validate.non_negative("--warmup-steps", cfg.optim.warmup_steps)
    if not 0 <= cfg.optim.min_lr_ratio <= 1:
        raise ConfigError("--min-lr-ratio", f"must be in 0..1, got {cfg.optim.min_lr_ratio!r}")
    validate.non_negative("--weight-decay", cfg.optim.weight_decay)
    validate.non_negative("--grad-clip", cfg.optim.grad_clip)
    validate.non_negative("--checkpoint-every", cfg.checkpoint.every)
    if cfg.checkpoint.every and cfg.checkpoint.dir is None:
        raise ConfigError("--checkpoint-every", "needs --checkpoint-dir")
    validate.positive("--keep-checkpoints", cfg.checkpoint.keep)
    if cfg.log.log_every is not None:
        validate.between("--log-every", cfg.log.log_every, 1, 1_000_000)
    if cfg.log.metrics_port is not None:
        validate.port("--metrics-port", cfg.log.metrics_port)
    if cfg.log.job_name is not None:
        validate.dns1123_label("--job-name", cfg.log.job_name)
    for name, value in cfg.model.overrides.items():
        validate.positive(f"--{name.replace('_', '-')}", value)
    if check_paths:
        _validate_paths(cfg)


def _validate_paths(cfg: TrainConfig) -> None:
    if cfg.data.source != "synthetic" and not Path(cfg.data.source).exists():
        raise InputError(f"--data: {cfg.data.source} does not exist "
                         "(give a .txt/.jsonl file, a directory of them, or 'synthetic')")
    if cfg.data.tokenizer is not None:
        tok = Path(cfg.data.tokenizer)
        if not tok.is_dir():
            raise InputError(f"--tokenizer: {tok} is not a directory")
        if not (tok / "tokenizer.json").is_file():
            raise InputError(f"--tokenizer: {tok} has no tokenizer.json")
    if cfg.model.hf_checkpoint is not None:
        ckpt = Path(cfg.model.hf_checkpoint)
        if not (ckpt / "config.json").is_file():
            raise InputError(f"--hf-checkpoint: {ckpt} has no config.json")
        if not any(ckpt.glob("*.safetensors")):
            raise InputError(f"--hf-checkpoint: {ckpt} has no *.safetensors files")
    # Both are written late (the final save, the first log window): find out now, not then.
    if cfg.checkpoint.dir is not None:
        _writable_dir("--checkpoint-dir", Path(cfg.checkpoint.dir))
    if cfg.log.log_jsonl is not None:
        _writable_dir("--log-jsonl", Path(cfg.log.log_jsonl).parent)


def _writable_dir(flag: str, path: Path) -> None:
    """Create ``path`` (and its parents) if missing; InputError unless we can write there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"{flag}: {path} is not a directory") from None
    except OSError as exc:
        raise InputError(f"{flag}: cannot create {path}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise InputError(f"{flag}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: {path} is not writable")


def model_args_for(cfg: TrainConfig, base: ModelArgs | None = None) -> ModelArgs:
    """The flavour's (or the HF config's) shape with command-line overrides, checked."""
    args = (base or FLAVOURS[cfg.model.name]).replace(**cfg.model.overrides)
    if args.dim % args.n_heads:
        raise ConfigError("--dim", f"{args.dim} is not divisible by --n-heads {args.n_heads}")
    if args.n_heads % args.n_kv_heads:
        raise ConfigError("--n-kv-heads",
                          f"{args.n_kv_heads} does not divide --n-heads {args.n_heads}")
    if args.head_dim % 2:
        raise ConfigError("--dim", f"head dim {args.head_dim} must be even for rotary embeddings")
    if cfg.data.seq_len > args.max_seq_len:
        raise ConfigError("--seq-len", f"{cfg.data.seq_len} exceeds the model's max sequence "
                          f"length {args.max_seq_len}")
    return args
